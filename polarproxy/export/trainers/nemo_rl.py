"""`--format nemo-rl`: one JSONL line per episode, `rollout_details` holding one element per linear segment
(each trajectory of the episode: one for a linear agent loop, one per leaf path of a branched one), each
`{prompt_token_ids, completion_token_ids, logprobs, extra}` as per-turn lists (the `RolloutDetail` shape):
turn i's completion is the tokens call i sampled and its logprobs (the same length), its prompt the whole
prompt the model was shown for it, which extends the previous turn's prompt and completion (NeMo RL's Gym
path asserts this and trains the difference as context); `extra` holds each turn's `call_id`. Then
`reward`, `advantage`, `group_id` and polarproxy's own fields under `polarproxy`."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from polarproxy.export.rows import ExportStats
from polarproxy.export.trainer_rows import TrainerRow, row_extras
from polarproxy.export.trainers import TrainerOptions, by_episode, trainer_rows
from polarproxy.export.trainers.jsonl_lines import floats, write_lines
from polarproxy.reconstruct.trajectory import SpanTrajectory, Trajectory


def segment(row: TrainerRow) -> dict[str, Any]:
    return {
        "prompt_token_ids": [row.ids[:a] for a, _b in row.spans],
        "completion_token_ids": [row.ids[a:b] for a, b in row.spans],
        "logprobs": [floats(row.logprobs[a:b]) for a, b in row.spans],
        "extra": {"call_id": row.traj.call_ids},
    }


def nemo_rl_line(rows: list[TrainerRow]) -> dict[str, Any]:
    first = rows[0]
    extras = row_extras(first)
    extras["call_ids"] = [c for r in rows for c in r.traj.call_ids]
    return {
        "rollout_details": [segment(r) for r in rows],
        "reward": first.traj.reward,
        "advantage": first.traj.advantage,
        "group_id": first.group,
        "polarproxy": extras,
    }


def write_nemo_rl(
    trajectories: Iterable[Trajectory | SpanTrajectory], out: str | os.PathLike[str], options: TrainerOptions
) -> ExportStats:
    stats = ExportStats()

    def lines() -> Iterator[dict[str, Any]]:
        for rows in by_episode(trainer_rows(trajectories, stats)):
            yield nemo_rl_line(rows)

    write_lines(lines(), out)
    return stats
