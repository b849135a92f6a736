"""The trainer formats of `polarproxy export --format slime|verl|trl|nemo-rl|openrlhf`: the rows each
trainer reads, in its own names and file type (docs/trainers.md says how each one loads them).

Every format carries the same tokens (export/trainer_rows.py): the trainable tokens are exactly the sampled
tokens of the row's calls (T4), tool outputs and the harness's own tokens are masked, rows without token IDs
or logprobs are refused, and polarproxy's own fields ride along under `polarproxy` (or in slime's
`metadata`). A writer takes the trajectories and `out` and returns ExportStats, as the row formats do; a
row it cannot carry raises TrainerRowError and leaves `out` as it was.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from polarproxy.choices import TRAINER_FORMATS
from polarproxy.export.rows import ExportStats
from polarproxy.export.trainer_rows import TrainerRow, trainer_row
from polarproxy.reconstruct.trajectory import SpanTrajectory, Trajectory


@dataclass(frozen=True, slots=True)
class TrainerOptions:
    """`groups_per_file`: slime's groups per training step, one file each when `out` holds `{rollout_id}`;
    `group_sizes`: how many episodes each group (`TrainerRow.group`) has in this export, so a step file is
    written as soon as its groups are complete (without it, every group completes at the end); `first_step`:
    the number of the first step file."""

    groups_per_file: int = 1
    group_sizes: Mapping[str, int] | None = None
    first_step: int = 0  # the number of slime's first step file (`export --follow` goes on counting)


class TrainerWriter(Protocol):
    def __call__(
        self,
        trajectories: Iterable[Trajectory | SpanTrajectory],
        out: str | os.PathLike[str],
        options: TrainerOptions,
    ) -> ExportStats: ...


def trainer_rows(
    trajectories: Iterable[Trajectory | SpanTrajectory], stats: ExportStats
) -> Iterator[TrainerRow]:
    """Each trajectory as a TrainerRow, counted in `stats`; TrainerRowError for one a trainer cannot take."""
    for traj in trajectories:
        row = trainer_row(traj)
        stats.add(traj)
        yield row


def by_episode(rows: Iterable[TrainerRow]) -> Iterator[list[TrainerRow]]:
    """The rows of each episode together (the strategies give an episode's rows one after another)."""
    batch: list[TrainerRow] = []
    for row in rows:
        if batch and row.traj.episode_id != batch[0].traj.episode_id:
            yield batch
            batch = []
        batch.append(row)
    if batch:
        yield batch


def get_trainer_writer(fmt: str) -> TrainerWriter:
    """The writer of trainer format `fmt`; ValueError naming the allowed ones otherwise."""
    if fmt == "slime":
        from polarproxy.export.trainers.slime import write_slime

        return write_slime
    if fmt == "verl":
        from polarproxy.export.trainers.verl import write_verl

        return write_verl
    if fmt == "trl":
        from polarproxy.export.trainers.trl import write_trl

        return write_trl
    if fmt == "nemo-rl":
        from polarproxy.export.trainers.nemo_rl import write_nemo_rl

        return write_nemo_rl
    if fmt == "openrlhf":
        from polarproxy.export.trainers.openrlhf import write_openrlhf

        return write_openrlhf
    raise ValueError(
        f"Unknown trainer format {fmt!r}. Must be one of {', '.join(map(repr, TRAINER_FORMATS))}."
    )
