"""What every trainer format reads from a trajectory: the token stream, its sampled spans and their logprobs
as arrays, and the checks that make a row trainable.

A trajectory is one linear token stream (reconstruct/): each of its calls sampled one span of it (its
`call_spans`), and everything else (the first prompt, tool outputs, the harness's own tokens) is context
the model was shown. Each trainer names the parts differently (export/trainer_formats.py); all of them get
the same tokens, the same mask (T4: the trainable tokens are exactly the sampled tokens of the row's calls)
and the same logprobs, 0.0 where a trainer wants a value outside the sampled spans.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from polarproxy.export.advantages import group_of
from polarproxy.reconstruct.trajectory import SpanTrajectory, Trajectory

NO_TOKENS_HINT = (
    "Trainer formats need the token IDs the model sampled; calls recorded at fidelity text (a chat-mode "
    "backend that returns none) cannot be trained on. Leave those episodes out (--episode, --harness, "
    "--since), or export them as chat messages with --format sft."
)


class TrainerRowError(ValueError):
    """A trajectory that a trainer format cannot carry (no token IDs, no logprobs, mixed temperatures)."""


@dataclass(slots=True)
class TrainerRow:
    """One trajectory as arrays: `ids` (int32, the whole stream), `spans` (each call's sampled [start, end),
    in order), `logprobs` (float32, one per position, 0.0 outside the spans), and the trajectory itself for
    every other field."""

    traj: Trajectory | SpanTrajectory
    ids: np.ndarray
    spans: list[tuple[int, int]]
    logprobs: np.ndarray

    @property
    def prompt_len(self) -> int:
        """Where the first sampled token is: what comes before it is the prompt, the rest the response."""
        return self.spans[0][0]

    def mask(self, start: int = 0) -> np.ndarray:
        """The loss mask from `start` on (int8: 1 on sampled tokens)."""
        out = np.zeros(len(self.ids) - start, dtype=np.int8)
        for a, b in self.spans:
            out[a - start : b - start] = 1
        return out

    @property
    def group(self) -> str:
        """The group this row's advantage was computed in (export/advantages.py), or the one it would be."""
        meta = self.traj.metadata
        if meta.get("advantage_group"):
            return str(meta["advantage_group"])
        return group_of(self.traj.group_id, meta.get("task"), self.traj.episode_id)

    @property
    def trainable_tokens(self) -> int:
        return sum(b - a for a, b in self.spans)


def trainer_row(traj: Trajectory | SpanTrajectory) -> TrainerRow:
    """The arrays of `traj`; TrainerRowError for a row without token IDs, a call without logprobs, or
    spans out of order."""
    where = f"episode {traj.episode_id} (calls {', '.join(traj.call_ids) or 'none'})"
    if not len(traj.input_ids) or not traj.call_spans:
        raise TrainerRowError(f"{where} has no token IDs (recorded at fidelity text). {NO_TOKENS_HINT}")
    spans = [(int(a), int(b)) for a, b in traj.call_spans]
    end = 0
    for a, b in spans:
        if a < end or b < a or b > len(traj.input_ids):
            raise TrainerRowError(f"{where} has call spans {spans} out of order or past its tokens.")
        end = b
    if isinstance(traj, SpanTrajectory):
        missing = [c for c, lps in zip(traj.call_ids, traj.span_logprobs, strict=True) if lps is None]
        ids = np.asarray(traj.input_ids, dtype=np.int32)
        logprobs = traj.logprobs_filled(0.0, np.float32)
    else:
        missing = [
            c
            for c, (a, b) in zip(traj.call_ids, spans, strict=True)
            if any(lp is None for lp in traj.logprobs[a:b])
        ]
        ids = np.asarray(traj.input_ids, dtype=np.int32)
        logprobs = np.asarray([0.0 if lp is None else lp for lp in traj.logprobs], dtype=np.float32)
    if missing:
        raise TrainerRowError(
            f"{where}: call(s) {', '.join(missing)} recorded no logprobs; trainer formats carry the sampler's "
            "logprobs. Record with a backend that returns them (SGLang, vLLM, the local backend), or leave "
            "those episodes out."
        )
    return TrainerRow(traj, ids, spans, logprobs)


def one_temperature(seen: Counter[float | None], fmt: str) -> None:
    """`seen`: logprob temperatures by call. TrainerRowError when there is more than one: `fmt`'s trainer
    scores a whole batch at one temperature."""
    if len(seen) <= 1:
        return
    listed = ", ".join(f"{'unknown' if t is None else t} ({n} calls)" for t, n in seen.most_common())
    raise TrainerRowError(
        f"The rows' logprobs are at more than one temperature: {listed}. {fmt} scores a batch at one "
        "temperature, so its importance ratios would be wrong for the others. Export the calls of one "
        "temperature at a time (--since, --harness, --episode), or use --format jsonl and `polarproxy "
        "train`, which scores each token at its own."
    )


def weight_version_number(value: str | None) -> int | str | None:
    """A weight version as the trainers count them (an int) when it is one, else as recorded."""
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return value


def row_extras(row: TrainerRow) -> dict[str, Any]:
    """polarproxy's own fields that ride along in every trainer format (names no trainer reads)."""
    t = row.traj
    return {
        "episode_id": t.episode_id,
        "call_ids": t.call_ids,
        "group_id": t.group_id,
        "advantage_group": row.group,
        "task": t.metadata.get("task"),
        "harness": t.metadata.get("harness"),
        "episode_metadata": t.metadata.get("episode_metadata", {}),
        "logprob_temperatures": t.logprob_temperatures,
        "temperatures": t.temperatures,
        "weight_versions": t.weight_versions,
        "strategy": t.strategy,
    }
