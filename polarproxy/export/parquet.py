"""Parquet export: the rows of schemas/export-row.v3.json as a table, written streaming in row groups.

Columns are the row's keys. Token arrays are typed lists (`input_ids` int32, `loss_mask` int8, `logprobs`
float32, the store's precision: the values equal the JSONL ones). `messages` is a list of structs with
every key of the schema's message (absent keys are null). Two fields hold free-form JSON objects and are
stored as JSON text: `metadata` (its keys may grow without a new schema version) and each tool's
`function.parameters` (a JSON Schema). `read_parquet_rows` turns a file back into rows equal to the JSONL
ones. Readable by pyarrow, pandas and `datasets.load_dataset("parquet", data_files=...)`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from polarproxy.export.atomic import atomic_file
from polarproxy.export.rows import ROW_SCHEMA, ExportStats, checked_row, span_row
from polarproxy.reconstruct.trajectory import SpanTrajectory, Trajectory

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["arrow_schema", "read_parquet_rows", "write_parquet"]

# A row group is flushed once it holds this many tokens or rows: memory stays bounded by two row groups
# (one being written while the next is made).
ROW_GROUP_TOKENS = 1 << 20
ROW_GROUP_ROWS = 4096
_JSON_TEXT = ("metadata",)
_TOKEN_COLUMNS = ("input_ids", "loss_mask", "logprobs")
_DTYPES = {"input_ids": np.int32, "loss_mask": np.int8, "logprobs": np.float32}
# Dictionary encoding and column statistics pay off for the scalar columns only; on token columns they
# cost time and give nothing (min/max of token IDs). zstd level 1 is as small as the default here, faster.
_DICTIONARY_COLUMNS = ["strategy", "episode_id", "model", "weight_version", "finish_reason", "group_id"]
_STATISTICS_COLUMNS = [*_DICTIONARY_COLUMNS, "schema_version", "reward", "advantage"]
_OPTIONAL_MESSAGE_KEYS = ("reasoning_content", "tool_calls", "tool_call_id", "name")


def _import_pyarrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - pyarrow is an install requirement
        raise RuntimeError(
            "Parquet export needs pyarrow, which is not installed. Run `pip install pyarrow`, "
            "or export with --format jsonl."
        ) from exc
    return pa, pq


def arrow_schema() -> pa.Schema:
    """The Arrow schema of a Parquet export."""
    pa, _ = _import_pyarrow()
    string = pa.string()
    tool_call = pa.struct(
        [
            ("id", string),
            ("type", string),
            ("function", pa.struct([("name", string), ("arguments", string)])),
        ]
    )
    message = pa.struct(
        [
            ("role", string),
            ("content", string),
            ("reasoning_content", string),
            ("tool_calls", pa.list_(tool_call)),
            ("tool_call_id", string),
            ("name", string),
        ]
    )
    tool = pa.struct(
        [
            ("type", string),
            ("function", pa.struct([("name", string), ("description", string), ("parameters", string)])),
        ]
    )
    return pa.schema(
        [
            pa.field("schema_version", pa.int32(), nullable=False),
            pa.field("strategy", string, nullable=False),
            pa.field("episode_id", string, nullable=False),
            pa.field("call_ids", pa.list_(string), nullable=False),
            pa.field("input_ids", pa.list_(pa.int32()), nullable=False),
            pa.field("loss_mask", pa.list_(pa.int8()), nullable=False),
            pa.field("logprobs", pa.list_(pa.float32()), nullable=False),
            pa.field("model", string, nullable=False),
            pa.field("weight_version", string),
            pa.field("finish_reason", string),
            pa.field("messages", pa.list_(message), nullable=False),
            pa.field("tools", pa.list_(tool), nullable=False),
            pa.field("reward", pa.float64()),
            pa.field("group_id", string),
            pa.field("call_rewards", pa.list_(pa.float64()), nullable=False),
            pa.field("weight_versions", pa.list_(string), nullable=False),
            pa.field("temperatures", pa.list_(pa.float64()), nullable=False),
            pa.field("logprob_temperatures", pa.list_(pa.float64()), nullable=False),
            pa.field("top_ps", pa.list_(pa.float64()), nullable=False),
            pa.field("top_ks", pa.list_(pa.int64()), nullable=False),
            pa.field("mixed_weight_versions", pa.list_(pa.bool_()), nullable=False),
            pa.field("truncated_sampling", pa.bool_(), nullable=False),
            pa.field("advantage", pa.float64()),
            pa.field("metadata", string, nullable=False),
        ],
        metadata={
            "polarproxy.row_schema": ROW_SCHEMA,
            "polarproxy.json_text": "metadata, tools[].function.parameters",
        },
    )


def _tools_for_arrow(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {**t, "function": {**t["function"], "parameters": orjson.dumps(t["function"]["parameters"]).decode()}}
        for t in tools
    ]


def _span_logprobs(traj: Trajectory) -> tuple[np.ndarray, np.ndarray]:
    """(values, valid) of the logprobs column built from the call output spans alone (the rest is null);
    for a trajectory whose logprobs all lie inside its spans (see rows.checked_row)."""
    lps, n = traj.logprobs, len(traj.logprobs)
    spans = traj.call_spans
    values = np.zeros(n, dtype=np.float32)
    valid = np.zeros(n, dtype=np.bool_)
    for a, b in spans:
        part = lps[a:b]
        if None in part:
            for i, v in enumerate(part, start=a):
                if v is not None:
                    values[i], valid[i] = v, True
        else:
            values[a:b] = part
            valid[a:b] = True
    return values, valid


class _RowGroup:
    """Rows buffered until a row group is full: token arrays as numpy arrays (one per row), the other
    columns as Python values."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.columns: dict[str, list[Any]] = {name: [] for name in schema.names if name not in _TOKEN_COLUMNS}
        self.ids: list[np.ndarray] = []
        self.masks: list[np.ndarray] = []
        self.logprobs: list[np.ndarray] = []
        self.valid: list[np.ndarray] = []
        self.tokens = 0
        self.rows = 0

    def _add_columns(self, row: dict[str, Any]) -> None:
        cols = self.columns
        for name, value in row.items():
            if name in _TOKEN_COLUMNS:
                continue
            if name in _JSON_TEXT:
                value = orjson.dumps(value).decode()
            elif name == "tools":
                value = _tools_for_arrow(value)
            cols[name].append(value)

    def add(self, traj: Trajectory | SpanTrajectory) -> None:
        if isinstance(traj, SpanTrajectory):  # arrays already: no conversion per token
            self._add_columns(span_row(traj, {}))
            self.ids.append(traj.input_ids)
            self.masks.append(traj.loss_mask_array())
            values, valid = traj.logprob_arrays()
        else:
            row, in_spans = checked_row(traj)
            self._add_columns(row)
            self.ids.append(np.fromiter(traj.input_ids, dtype=np.int32, count=len(traj.input_ids)))
            self.masks.append(np.frombuffer(bytes(traj.loss_mask), dtype=np.int8))
            if in_spans:
                values, valid = _span_logprobs(traj)
            else:
                lps = traj.logprobs
                values = np.array([0.0 if v is None else v for v in lps], dtype=np.float32)
                valid = np.array([v is not None for v in lps], dtype=np.bool_)
        self.logprobs.append(values)
        self.valid.append(valid)
        self.tokens += len(traj.input_ids)
        self.rows += 1

    def full(self) -> bool:
        return self.tokens >= ROW_GROUP_TOKENS or self.rows >= ROW_GROUP_ROWS

    def table(self) -> pa.Table:
        pa, _ = _import_pyarrow()
        offsets = pa.array(np.cumsum([0, *(len(a) for a in self.ids)], dtype=np.int32))

        def tokens(parts: list[np.ndarray], name: str, mask: np.ndarray | None = None) -> pa.Array:
            list_type = self.schema.field(name).type
            values = np.concatenate(parts) if parts else np.zeros(0, _DTYPES[name])
            return pa.ListArray.from_arrays(offsets, pa.array(values, mask=mask), type=list_type)

        invalid = ~np.concatenate(self.valid) if self.valid else None
        token_arrays = {
            "input_ids": tokens(self.ids, "input_ids"),
            "loss_mask": tokens(self.masks, "loss_mask"),
            "logprobs": tokens(self.logprobs, "logprobs", invalid),
        }
        arrays = [
            token_arrays[f.name] if f.name in token_arrays else pa.array(self.columns[f.name], type=f.type)
            for f in self.schema
        ]
        return pa.Table.from_arrays(arrays, schema=self.schema)


def write_parquet(
    trajectories: Iterable[Trajectory | SpanTrajectory],
    out: str | os.PathLike[str],
    *,
    append: Callable[[], Sequence[str]] | None = None,
    durable: bool = True,
) -> ExportStats:
    """Write one row per trajectory to the Parquet file `out`, atomically (the old file or the complete new
    one), one row group at a time. Raises ValueError for a row that cannot be exported (see
    trajectory_to_row). Trajectories without a token are left out and counted
    (`ExportStats.skipped_empty_rows`). `append`: called once the rows are written, it gives Parquet files
    of this schema whose row groups follow them (the parts of a parallel export, export/parallel.py).
    `durable` False: the file is not synced to disk (such a part, synced where it is appended)."""
    _pa, pq = _import_pyarrow()
    schema = arrow_schema()
    stats = ExportStats()
    with (
        atomic_file(out, durable=durable) as f,
        pq.ParquetWriter(
            f.path,
            schema,
            compression="zstd",
            compression_level=1,
            use_dictionary=_DICTIONARY_COLUMNS,
            write_statistics=_STATISTICS_COLUMNS,
        ) as writer,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="parquet-write") as pool,
    ):
        # A full row group is encoded and compressed in `pool` (pyarrow does it without the GIL) while the
        # next one is made; at most one is written at a time, so memory holds two row groups at most.
        pending: Future[None] | None = None

        def flush(group: _RowGroup) -> Future[None]:
            if pending is not None:
                pending.result()
            return pool.submit(writer.write_table, group.table(), row_group_size=group.rows)

        group = _RowGroup(schema)
        for traj in trajectories:
            if stats.skip_if_empty(traj):
                continue
            group.add(traj)
            stats.add(traj)
            if group.full():
                pending = flush(group)
                group = _RowGroup(schema)
        if group.rows:
            pending = flush(group)
        if pending is not None:
            pending.result()
        for part in append() if append is not None else ():
            source = pq.ParquetFile(part)
            for i in range(source.num_row_groups):  # row group by row group: memory stays at one
                table = source.read_row_group(i)
                writer.write_table(table, row_group_size=table.num_rows)
    return stats


def _message_from_arrow(message: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if v is not None or k not in _OPTIONAL_MESSAGE_KEYS}


def read_parquet_rows(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The rows of a Parquet export as JSONL rows (JSON text columns parsed, absent message keys left
    out), one row group at a time."""
    _pa, pq = _import_pyarrow()
    parquet = pq.ParquetFile(path)
    for i in range(parquet.num_row_groups):
        for row in parquet.read_row_group(i).to_pylist():
            for name in _JSON_TEXT:
                row[name] = orjson.loads(row[name])
            row["messages"] = [_message_from_arrow(m) for m in row["messages"]]
            for tool in row["tools"]:
                tool["function"]["parameters"] = orjson.loads(tool["function"]["parameters"])
            yield row
