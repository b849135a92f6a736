"""Trajectory → export row (schemas/export-row.v1.json), shared by every export format."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from polarproxy.reconstruct.trajectory import Trajectory

SCHEMA_VERSION = 1
ROW_SCHEMA = "export-row.v1"


@dataclass(slots=True)
class ExportStats:
    rows: int = 0
    calls: int = 0
    trainable_tokens: int = 0
    total_tokens: int = 0

    def add(self, traj: Trajectory) -> None:
        self.rows += 1
        self.calls += len(traj.call_ids)
        self.trainable_tokens += sum(traj.loss_mask)
        self.total_tokens += len(traj.input_ids)


def trajectory_to_row(traj: Trajectory) -> dict[str, Any]:
    """The export row for a trajectory. Raises ValueError if the arrays differ in length or a logprob is
    not finite (JSON has no -inf; writing null would silently drop it)."""
    n = len(traj.input_ids)
    if len(traj.loss_mask) != n or len(traj.logprobs) != n:
        raise ValueError(
            f"Trajectory of calls {traj.call_ids} has {n} input_ids, {len(traj.loss_mask)} loss_mask and "
            f"{len(traj.logprobs)} logprobs entries; they must be equal."
        )
    for i, lp in enumerate(traj.logprobs):
        if lp is not None and not math.isfinite(lp):
            raise ValueError(
                f"Trajectory of calls {traj.call_ids} has logprob {lp} at position {i}, which JSON cannot "
                "represent. Exclude these calls from the export."
            )
    return {
        "schema_version": SCHEMA_VERSION,
        "strategy": traj.strategy,
        "episode_id": traj.episode_id,
        "call_ids": traj.call_ids,
        "input_ids": traj.input_ids,
        "loss_mask": traj.loss_mask,
        "logprobs": traj.logprobs,
        "model": traj.model,
        "weight_version": traj.weight_version,
        "finish_reason": traj.finish_reason,
        "messages": traj.messages,
        "tools": traj.tools,
        "reward": traj.reward,
        "group_id": traj.group_id,
        "metadata": traj.metadata,
    }
