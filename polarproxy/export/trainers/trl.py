"""`--format trl`: what TRL's GRPOTrainer takes back from a `rollout_func`, one JSONL line per episode:
`prompt_ids`, `completion_ids`, `logprobs` and `env_mask` (one per completion token; `env_mask` 1 on the
tokens the model sampled, 0 on tool outputs and the harness's tokens, whose logprob is 0.0), `reward`,
`advantage`, `group_id`; polarproxy's own fields under `polarproxy`.

TRL generates `num_generations` completions per prompt and computes its own advantages over them, so the
file must hold one row per episode and groups of one size: an episode with several trajectories (a
branched or broken conversation) and groups of another size than the most common are refused, naming them.
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from typing import Any

from polarproxy.export.rows import ExportStats
from polarproxy.export.trainer_rows import TrainerRow, TrainerRowError, row_extras
from polarproxy.export.trainers import TrainerOptions, by_episode, trainer_rows
from polarproxy.export.trainers.jsonl_lines import floats, write_lines
from polarproxy.reconstruct.trajectory import SpanTrajectory, Trajectory


def trl_line(row: TrainerRow) -> dict[str, Any]:
    p = row.prompt_len
    return {
        "prompt_ids": row.ids[:p],
        "completion_ids": row.ids[p:],
        "logprobs": floats(row.logprobs[p:]),
        "env_mask": row.mask(p),
        "reward": row.traj.reward,
        "advantage": row.traj.advantage,
        "group_id": row.group,
        "polarproxy": row_extras(row),
    }


def _named(items: list[str], limit: int = 8) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def write_trl(
    trajectories: Iterable[Trajectory | SpanTrajectory], out: str | os.PathLike[str], options: TrainerOptions
) -> ExportStats:
    stats = ExportStats()
    split: list[str] = []
    groups: dict[str, list[str]] = defaultdict(list)

    def lines() -> Iterator[dict[str, Any]]:
        for rows in by_episode(trainer_rows(trajectories, stats)):
            episode = rows[0].traj.episode_id
            if len(rows) > 1:
                split.append(f"{episode} ({len(rows)} rows)")
                continue
            groups[rows[0].group].append(episode)
            yield trl_line(rows[0])
        if split:
            raise TrainerRowError(
                f"TRL takes one row per episode; {len(split)} episode(s) have several: {_named(split)}. Their "
                "conversations branch or break (compaction, a side request), so no single sequence holds "
                "them. Export with --strategy prefix-merge (a linear agent loop is one row), leave these "
                "episodes out (--episode), or use --format verl, slime or openrlhf, which take one row per "
                "trajectory."
            )
        sizes = Counter(len(eps) for eps in groups.values())
        if len(sizes) > 1:
            size = max(sizes, key=lambda k: (sizes[k], k))  # the most common size; on a tie the largest
            odd = [f"{g} ({len(eps)}: {_named(eps, 3)})" for g, eps in groups.items() if len(eps) != size]
            raise TrainerRowError(
                f"TRL takes groups of one size (its num_generations); most groups here have {size} "
                f"episode(s), these do not: {_named(odd, 5)}. Export complete groups only (--group, "
                "--episode), or run the missing samples."
            )

    write_lines(lines(), out)
    return stats
