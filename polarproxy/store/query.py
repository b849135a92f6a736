"""Which episodes to read: the filters of `polarproxy ls` and `polarproxy export`, as SQL conditions.

One mechanism for every reader, so a filter means the same in `ls`, in every export format and in the
advantage computation (which sees only the episodes that pass).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, get_args

from polarproxy.store import schema
from polarproxy.store.records import EpisodeStatus

EPISODE_STATUSES: tuple[str, ...] = get_args(EpisodeStatus)
E = schema.episodes


@dataclass(slots=True, frozen=True)
class EpisodeQuery:
    """Episodes to keep; None is no condition. `since` is a Unix time (the episode started at or after it);
    `min_reward` keeps episodes whose own reward is at least it (episodes without one are left out);
    `episode_ids` are exact IDs."""

    task: str | None = None
    group_id: str | None = None
    status: str | None = None
    harness: str | Sequence[str] | None = None  # one harness, or any of several
    since: float | None = None
    min_reward: float | None = None
    episode_ids: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in EPISODE_STATUSES:
            raise ValueError(
                f"Unknown episode status {self.status!r}. Must be one of {', '.join(map(repr, EPISODE_STATUSES))}."
            )

    def conditions(self) -> list[Any]:
        out: list[Any] = []
        if self.task is not None:
            out.append(E.c.task == self.task)
        if self.group_id is not None:
            out.append(E.c.group_id == self.group_id)
        if self.status is not None:
            out.append(E.c.status == self.status)
        if isinstance(self.harness, str):
            out.append(E.c.harness == self.harness)
        elif self.harness is not None:
            out.append(E.c.harness.in_(list(self.harness)))
        if self.since is not None:
            out.append(E.c.started_at >= self.since)
        if self.min_reward is not None:
            out.append(E.c.reward >= self.min_reward)  # NULL rewards never compare true
        if self.episode_ids is not None:
            out.append(E.c.id.in_(list(self.episode_ids)))
        return out
