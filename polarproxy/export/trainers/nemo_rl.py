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

import numpy as np

from polarproxy.export.rows import ExportStats
from polarproxy.export.trainer_rows import TrainerRow, row_extras
from polarproxy.export.trainers import TrainerOptions, by_episode, trainer_rows
from polarproxy.export.trainers.jsonl_lines import ArrayJson, Buffer, Spliced, floats, write_lines
from polarproxy.reconstruct.trajectory import SpanTrajectory, Trajectory


def segment(row: TrainerRow, line: Spliced) -> dict[str, Any]:
    """One linear segment's turns. Each turn's prompt repeats the one before: the tokens' text is made once
    and cut, and so is the text of the sampled spans' logprobs, one span after the other."""
    spans = np.asarray(row.spans, dtype=np.int64)  # a row has at least one span (trainer_row)
    starts, stops = spans[:, 0], spans[:, 1]
    ids = ArrayJson(row.ids)
    sampled = ArrayJson(floats(np.concatenate([row.logprobs[a:b] for a, b in row.spans])))
    ends = np.cumsum(stops - starts)
    return {
        "prompt_token_ids": line.arrays(ids.items(np.zeros_like(starts), starts)),
        "completion_token_ids": line.arrays(ids.items(starts, stops)),
        "logprobs": line.arrays(sampled.items(ends - (stops - starts), ends)),
        "extra": {"call_id": row.traj.call_ids},
    }


def nemo_rl_line(rows: list[TrainerRow]) -> list[Buffer]:
    """The episode's line, as the buffers to write one after the other."""
    first = rows[0]
    extras = row_extras(first)
    extras["call_ids"] = [c for r in rows for c in r.traj.call_ids]
    line = Spliced()
    return line.parts(
        {
            "rollout_details": [segment(r, line) for r in rows],
            "reward": first.traj.reward,
            "advantage": first.traj.advantage,
            "group_id": first.group,
            "polarproxy": extras,
        }
    )


def write_nemo_rl(
    trajectories: Iterable[Trajectory | SpanTrajectory], out: str | os.PathLike[str], options: TrainerOptions
) -> ExportStats:
    stats = ExportStats()

    def lines() -> Iterator[list[Buffer]]:
        for rows in by_episode(trainer_rows(trajectories, stats)):
            yield nemo_rl_line(rows)

    write_lines(lines(), out)
    return stats
