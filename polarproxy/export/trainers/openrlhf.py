"""`--format openrlhf`: what an OpenRLHF agent executor returns per sample, one JSONL line per trajectory:
`observation_tokens` (the whole stream), `action_ranges` ([start, end) of each sampled span),
`rollout_log_probs` (one per observation token, 0.0 outside the actions), `reward`, `truncated`,
`min_weight_version`,
`max_weight_version`; then `advantage`, `group_id` and polarproxy's own fields under `polarproxy`."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from polarproxy.export.rows import ExportStats
from polarproxy.export.trainer_rows import TrainerRow, row_extras, weight_version_number
from polarproxy.export.trainers import TrainerOptions, trainer_rows
from polarproxy.export.trainers.jsonl_lines import floats, write_lines
from polarproxy.reconstruct.trajectory import SpanTrajectory, Trajectory


def openrlhf_line(row: TrainerRow) -> dict[str, Any]:
    versions = [weight_version_number(v) for v in row.traj.weight_versions if v is not None]
    numeric = [v for v in versions if isinstance(v, int)]
    ordered = numeric if len(numeric) == len(versions) else [str(v) for v in versions]
    return {
        "observation_tokens": row.ids,
        "action_ranges": [[a, b] for a, b in row.spans],
        "rollout_log_probs": floats(row.logprobs),
        "reward": row.traj.reward,
        "truncated": row.traj.finish_reason == "length",
        "min_weight_version": min(ordered) if ordered else None,  # type: ignore[type-var]
        "max_weight_version": max(ordered) if ordered else None,  # type: ignore[type-var]
        "advantage": row.traj.advantage,
        "group_id": row.group,
        "polarproxy": row_extras(row),
    }


def write_openrlhf(
    trajectories: Iterable[Trajectory | SpanTrajectory], out: str | os.PathLike[str], options: TrainerOptions
) -> ExportStats:
    stats = ExportStats()

    def lines() -> Iterator[dict[str, Any]]:
        for row in trainer_rows(trajectories, stats):
            yield openrlhf_line(row)

    write_lines(lines(), out)
    return stats
