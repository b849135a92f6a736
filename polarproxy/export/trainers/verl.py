"""`--format verl`: Parquet rows named as verl's `AgentLoopOutput`, one per trajectory (a branched episode
gives one row per leaf path, all with its group's `uid`): `prompt_ids`, `response_ids`, `response_mask`
(1 on sampled tokens), `response_logprobs` (one per response token, 0.0 where the mask is 0),
`reward_score`, `num_turns`, `uid` (the group), `advantage`; polarproxy's own fields as JSON text in
`polarproxy`. verl scores a batch at one temperature: rows whose logprobs are at several are refused.
polarproxy/integrations/verl_replay.py turns the rows back into `AgentLoopOutput`s."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np
import orjson

from polarproxy.export.atomic import atomic_file
from polarproxy.export.rows import ExportStats
from polarproxy.export.trainer_rows import TrainerRow, one_temperature, row_extras
from polarproxy.export.trainers import TrainerOptions, trainer_rows
from polarproxy.reconstruct.trajectory import SpanTrajectory, Trajectory

ROW_GROUP_TOKENS = 1 << 20  # a Parquet row group holds about this many tokens: memory holds one
ROW_GROUP_ROWS = 4096
TOKEN_COLUMNS = {
    "prompt_ids": np.int32,
    "response_ids": np.int32,
    "response_mask": np.int8,
    "response_logprobs": np.float32,
}


def verl_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
            pa.field("response_ids", pa.list_(pa.int32()), nullable=False),
            pa.field("response_mask", pa.list_(pa.int8()), nullable=False),
            pa.field("response_logprobs", pa.list_(pa.float32()), nullable=False),
            pa.field("reward_score", pa.float64()),
            pa.field("num_turns", pa.int32(), nullable=False),
            pa.field("uid", pa.string(), nullable=False),
            pa.field("advantage", pa.float64()),
            pa.field("polarproxy", pa.string(), nullable=False),
        ]
    )


class _Batch:
    def __init__(self) -> None:
        self.n_tokens = 0
        self.tokens: dict[str, list[np.ndarray]] = {name: [] for name in TOKEN_COLUMNS}
        self.columns: dict[str, list[Any]] = {
            "reward_score": [],
            "num_turns": [],
            "uid": [],
            "advantage": [],
            "polarproxy": [],
        }

    def add(self, row: TrainerRow) -> None:
        self.n_tokens += len(row.ids)
        p = row.prompt_len
        self.tokens["prompt_ids"].append(row.ids[:p])
        self.tokens["response_ids"].append(row.ids[p:])
        self.tokens["response_mask"].append(row.mask(p))
        self.tokens["response_logprobs"].append(row.logprobs[p:])
        self.columns["reward_score"].append(row.traj.reward)
        # verl counts the user turn and each assistant turn (its tool agent loop); a row of n calls has
        # n assistant turns
        self.columns["num_turns"].append(len(row.spans) + 1)
        self.columns["uid"].append(row.group)
        self.columns["advantage"].append(row.traj.advantage)
        self.columns["polarproxy"].append(orjson.dumps(row_extras(row)).decode())

    def __len__(self) -> int:
        return len(self.columns["uid"])

    def full(self) -> bool:
        return self.n_tokens >= ROW_GROUP_TOKENS or len(self) >= ROW_GROUP_ROWS

    def table(self, schema: Any) -> Any:
        import pyarrow as pa

        arrays = {}
        for name, dtype in TOKEN_COLUMNS.items():
            parts = self.tokens[name]
            offsets = pa.array(np.cumsum([0, *(len(a) for a in parts)], dtype=np.int32))
            values = np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)
            arrays[name] = pa.ListArray.from_arrays(offsets, pa.array(values), type=schema.field(name).type)
        for name, values in self.columns.items():
            arrays[name] = pa.array(values, type=schema.field(name).type)
        return pa.Table.from_arrays([arrays[f.name] for f in schema], schema=schema)


def write_verl(
    trajectories: Iterable[Trajectory | SpanTrajectory], out: str | os.PathLike[str], options: TrainerOptions
) -> ExportStats:
    import pyarrow.parquet as pq

    schema = verl_schema()
    stats = ExportStats()
    temperatures: Counter[float | None] = Counter()
    with (
        atomic_file(out) as f,
        pq.ParquetWriter(
            f.path,
            schema,
            compression="zstd",
            compression_level=1,
            use_dictionary=["uid"],  # token columns gain nothing from a dictionary, and cost time
            write_statistics=["reward_score", "num_turns", "advantage"],
        ) as writer,
    ):
        batch = _Batch()
        for row in trainer_rows(trajectories, stats):
            temperatures.update(row.traj.logprob_temperatures or [None] * len(row.spans))
            one_temperature(temperatures, "verl")
            batch.add(row)
            if batch.full():
                writer.write_table(batch.table(schema))
                batch = _Batch()
        if len(batch):
            writer.write_table(batch.table(schema))
    return stats
