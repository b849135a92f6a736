"""Trajectory → export row (schemas/export-row.v3.json), shared by every export format."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, fields
from itertools import chain
from typing import Any

import numpy as np

from polarproxy.reconstruct.trajectory import SpanTrajectory, Trajectory

SCHEMA_VERSION = 3
ROW_SCHEMA = "export-row.v3"
PER_CALL_FIELDS = (
    "call_rewards",
    "weight_versions",
    "temperatures",
    "logprob_temperatures",
    "top_ps",
    "top_ks",
    "mixed_weight_versions",
)


@dataclass(slots=True)
class ExportStats:
    """What an export wrote. `rows` is the number of trajectories (trainer sequences); `per_request_tokens`
    the tokens a per-request export of the same calls would hold (each call's prompt + output).
    `skipped_empty_rows`: trajectories without a single token (text-only calls in a token export), left
    out of the file; their calls are not in `calls`."""

    rows: int = 0
    calls: int = 0
    trainable_tokens: int = 0
    total_tokens: int = 0
    per_request_tokens: int = 0
    skipped_empty_rows: int = 0
    # calls by (temperature, top_p, top_k, logprob temperature): the distinct sampling settings written
    sampling: Counter[tuple[Any, ...]] = field(default_factory=Counter)
    files: list[str] = field(default_factory=list)  # a format written as several files (slime's steps)

    def add(self, traj: Trajectory | SpanTrajectory) -> None:
        self.rows += 1
        n = len(traj.call_ids)
        self.calls += n
        unknown = [None] * n
        self.sampling.update(
            zip(
                traj.temperatures or unknown,
                traj.top_ps or unknown,
                traj.top_ks or unknown,
                traj.logprob_temperatures or unknown,
                strict=False,
            )
        )
        if isinstance(traj, SpanTrajectory):
            self.trainable_tokens += traj.trainable_tokens
        else:
            self.trainable_tokens += _count_trainable(traj)
        self.total_tokens += len(traj.input_ids)
        self.per_request_tokens += sum(end for _start, end in traj.call_spans)

    def merge(self, other: ExportStats) -> None:
        """Add the figures of another part of the same export (export/parallel.py)."""
        for f in fields(ExportStats):
            if f.name == "sampling":
                self.sampling.update(other.sampling)
            else:
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def skip_if_empty(self, traj: Trajectory | SpanTrajectory) -> bool:
        """Count and return True for a trajectory without tokens, which a token export leaves out."""
        if len(traj.input_ids):
            return False
        self.skipped_empty_rows += 1
        return True

    @property
    def sequence_ratio(self) -> float | None:
        """Trainer sequences a per-request export would hold per row of this one (calls ÷ rows); None for
        an empty export. Every call is in exactly one row (T3), so per-request rows = calls."""
        return self.calls / self.rows if self.rows else None

    def summary(self) -> dict[str, Any]:
        """The figures `polarproxy export --json` prints; `sampling`: each distinct setting the calls were
        sampled under, with how many calls, the most common first."""
        return {
            "rows": self.rows,
            "calls": self.calls,
            "trajectories": self.rows,
            "trainable_tokens": self.trainable_tokens,
            "total_tokens": self.total_tokens,
            "per_request_tokens": self.per_request_tokens,
            "sequence_ratio": self.sequence_ratio,
            "skipped_empty_rows": self.skipped_empty_rows,
            "sampling": [
                {"temperature": t, "top_p": p, "top_k": k, "logprob_temperature": lt, "calls": n}
                for (t, p, k, lt), n in self.sampling.most_common()
            ],
            **({"files": self.files} if self.files else {}),
        }


def _count_trainable(traj: Trajectory) -> int:
    """`loss_mask.count(1)`, fast: counting 0s and the 1s inside the call output spans compares by identity
    (small ints are shared), where counting 1s among 0s compares each value. Exact: when the 0s and the
    span 1s do not cover every position, it falls back to counting."""
    mask, spans, end = traj.loss_mask, traj.call_spans, 0
    ones = 0
    for a, b in spans:
        if a < end or b < a:  # overlapping or unordered spans: count plainly
            return mask.count(1)
        ones += mask[a:b].count(1)
        end = b
    if ones + mask.count(0) == len(mask):
        return ones
    return mask.count(1)


def _logprobs_finite_in_spans(traj: Trajectory) -> bool:
    """Fast path of the finiteness check, at C speed: True when every logprob outside the call output spans
    is None and the ones inside are None or finite. False means: check token by token."""
    lps = traj.logprobs
    if not traj.call_spans:
        return False
    inside = list(chain.from_iterable(lps[a:b] for a, b in traj.call_spans))
    inside_nones = inside.count(None)
    if lps.count(None) != len(lps) - len(inside) + inside_nones:
        return False  # a logprob outside the spans (or overlapping spans)
    values = inside if not inside_nones else [v for v in inside if v is not None]
    try:
        return math.isfinite(sum(values))  # sums of logprobs (<= 0) do not overflow
    except TypeError:
        return False


def trajectory_to_row(traj: Trajectory | SpanTrajectory) -> dict[str, Any]:
    """The export row for a trajectory. Raises ValueError if the arrays differ in length or a logprob is
    not finite (JSON has no -inf; writing null would silently drop it)."""
    if isinstance(traj, SpanTrajectory):
        traj = traj.to_trajectory()
    return checked_row(traj)[0]


def checked_row(traj: Trajectory) -> tuple[dict[str, Any], bool]:
    """(the export row, whether every logprob lies inside the call output spans); errors as
    trajectory_to_row's."""
    n = len(traj.input_ids)
    if len(traj.loss_mask) != n or len(traj.logprobs) != n:
        raise ValueError(
            f"Trajectory of calls {traj.call_ids} has {n} input_ids, {len(traj.loss_mask)} loss_mask and "
            f"{len(traj.logprobs)} logprobs entries; they must be equal."
        )
    tokens = {"input_ids": traj.input_ids, "loss_mask": traj.loss_mask, "logprobs": traj.logprobs}
    row = row_fields(traj, tokens)
    in_spans = _logprobs_finite_in_spans(traj)
    if not in_spans:
        for i, lp in enumerate(traj.logprobs):
            if lp is not None and not math.isfinite(lp):
                raise ValueError(
                    f"Trajectory of calls {traj.call_ids} has logprob {lp} at position {i}, which JSON cannot "
                    "represent. Exclude these calls from the export."
                )
    return row, in_spans


def span_row(traj: SpanTrajectory, tokens: dict[str, Any]) -> dict[str, Any]:
    """checked_row for a SpanTrajectory, with its token columns given in the writer's own form."""
    row = row_fields(traj, tokens)
    check_span_logprobs(traj)
    return row


def row_fields(traj: Trajectory | SpanTrajectory, tokens: dict[str, Any]) -> dict[str, Any]:
    """The export row with the token columns given (`input_ids`, `loss_mask`, `logprobs`), in the schema's
    order; ValueError for per-call values that cannot be exported (see _per_call)."""
    per_call = _per_call(traj)
    return {
        "schema_version": SCHEMA_VERSION,
        "strategy": traj.strategy,
        "episode_id": traj.episode_id,
        "call_ids": traj.call_ids,
        **tokens,
        "model": traj.model,
        "weight_version": traj.weight_version,
        "finish_reason": traj.finish_reason,
        "messages": traj.messages,
        "tools": traj.tools,
        "reward": traj.reward,
        "group_id": traj.group_id,
        **per_call,
        "truncated_sampling": any(
            (p is not None and p < 1) or (k is not None and k > 0)
            for p, k in zip(per_call["top_ps"], per_call["top_ks"], strict=True)
        ),
        "advantage": traj.advantage,
        "metadata": traj.metadata,
    }


def check_span_logprobs(traj: SpanTrajectory) -> None:
    """trajectory_to_row's finiteness check for a SpanTrajectory, at numpy speed."""
    given = [lps for lps in traj.span_logprobs if lps is not None]
    if not given or np.isfinite(np.concatenate(given).sum(dtype=np.float64)):
        return  # sums of logprobs (<= 0) do not overflow in float64
    for (a, _b), lps in zip(traj.call_spans, traj.span_logprobs, strict=True):
        if lps is None:
            continue
        bad = np.flatnonzero(~np.isfinite(lps))
        if len(bad):
            i = int(bad[0])
            raise ValueError(
                f"Trajectory of calls {traj.call_ids} has logprob {float(lps[i])} at position {a + i}, which "
                "JSON cannot represent. Exclude these calls from the export."
            )


def _per_call(traj: Trajectory | SpanTrajectory) -> dict[str, list[Any]]:
    """The per-call columns, one entry per call ID. A trajectory built without them (empty lists) gets
    the values that mean "not recorded"."""
    n = len(traj.call_ids)
    out: dict[str, list[Any]] = {}
    for name in PER_CALL_FIELDS:
        values = getattr(traj, name)
        if not values:
            values = [False if name == "mixed_weight_versions" else None] * n
        elif len(values) != n:
            raise ValueError(
                f"Trajectory of calls {traj.call_ids} has {len(values)} {name} for {n} calls; give one per call."
            )
        out[name] = values
    for i, r in enumerate(out["call_rewards"]):
        if r is not None and not math.isfinite(r):
            raise ValueError(f"Call {traj.call_ids[i]} has reward {r}, which JSON cannot represent.")
    if traj.advantage is not None and not math.isfinite(traj.advantage):
        raise ValueError(f"Trajectory of calls {traj.call_ids} has advantage {traj.advantage}, not finite.")
    return out


def row_trajectory(row: dict[str, Any]) -> Trajectory:
    """The Trajectory of an export row (the trajectory stream's answer, a JSONL line): its calls' output
    spans from `metadata.call_output_spans` (prefix-merge rows), or for a row of one call the run of its
    sampled tokens. ValueError for a row that says neither."""
    mask = row["loss_mask"]
    spans = (row.get("metadata") or {}).get("call_output_spans")
    if spans is None:
        if len(row["call_ids"]) != 1:
            raise ValueError(
                f"Row of calls {row['call_ids']} has no metadata.call_output_spans saying which tokens each "
                "call sampled."
            )
        ones = [i for i, m in enumerate(mask) if m]
        spans = [[ones[0], ones[-1] + 1]] if ones else [[len(mask), len(mask)]]
    per_call = {name: row.get(name) or [] for name in PER_CALL_FIELDS}
    return Trajectory(
        episode_id=row["episode_id"],
        call_ids=list(row["call_ids"]),
        strategy=row["strategy"],
        input_ids=list(row["input_ids"]),
        loss_mask=list(mask),
        logprobs=list(row["logprobs"]),
        model=row["model"],
        weight_version=row.get("weight_version"),
        finish_reason=row.get("finish_reason"),
        messages=row.get("messages") or [],
        tools=row.get("tools") or [],
        reward=row.get("reward"),
        group_id=row.get("group_id"),
        metadata=dict(row.get("metadata") or {}),
        call_spans=[(int(a), int(b)) for a, b in spans],
        advantage=row.get("advantage"),
        **per_call,
    )
