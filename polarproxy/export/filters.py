"""Which episodes and calls an export reads: one filter mechanism for every format (jsonl, parquet, sft).

Episode filters (status, harness, task, group, start time, reward, the `--episode` list) become SQL
conditions (store/query.py), so the store reads only the episodes that pass, and the advantage computation
sees the same episodes. `model_name` is a glob on the model name each call asked for; calls that do not
match are left out before trajectories are built.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from polarproxy.errors import UsageError
from polarproxy.store.query import EPISODE_STATUSES, EpisodeQuery
from polarproxy.store.records import Call, Episode


@dataclass(slots=True, frozen=True)
class ExportFilters:
    """`export --status --min-reward --since --harness --model-name --task --group` (None: no condition).
    `since` is a Unix time; `min_reward` keeps episodes whose reward is at least it (episodes without a
    reward are left out)."""

    status: str | None = None
    min_reward: float | None = None
    since: float | None = None
    harness: str | Sequence[str] | None = None  # `--harness`, repeatable: any of them
    model_name: str | None = None
    task: str | None = None
    group: str | None = None
    episode_ids: Sequence[str] | None = field(default=None)

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in EPISODE_STATUSES:
            raise UsageError(
                f"Unknown --status {self.status!r}. Must be one of {', '.join(map(repr, EPISODE_STATUSES))}.",
                hint="--status ok keeps episodes whose harness exited 0.",
            )

    def query(self) -> EpisodeQuery:
        """The episode conditions, for Store.list_episodes / Store.iter_calls (`where=`)."""
        return EpisodeQuery(
            task=self.task,
            group_id=self.group,
            status=self.status,
            harness=self.harness,
            since=self.since,
            min_reward=self.min_reward,
            episode_ids=None if self.episode_ids is None else list(self.episode_ids),
        )

    def episode(self, ep: Episode) -> bool:
        """The episode conditions in Python, for episodes that did not come through `query()`."""
        checks = (
            self.status is None or ep.status == self.status,
            self.harness is None
            or (ep.harness == self.harness if isinstance(self.harness, str) else ep.harness in self.harness),
            self.task is None or ep.task == self.task,
            self.group is None or ep.group_id == self.group,
            self.since is None or ep.started_at >= self.since,
            self.min_reward is None or (ep.reward is not None and ep.reward >= self.min_reward),
            self.episode_ids is None or ep.id in self.episode_ids,
        )
        return all(checks)

    def call(self, call: Call) -> bool:
        return self.model_name is None or fnmatch.fnmatchcase(call.model, self.model_name)

    def calls(self, calls: Iterable[Call]) -> Iterator[Call]:
        """The calls that pass the call conditions (the model-name glob)."""
        if self.model_name is None:
            yield from calls
            return
        for c in calls:
            if self.call(c):
                yield c

    def describe(self) -> dict[str, Any]:
        """The conditions given, for the export summary."""
        out = {
            "status": self.status,
            "min_reward": self.min_reward,
            "since": self.since,
            "harness": self.harness
            if self.harness is None or isinstance(self.harness, str)
            else list(self.harness),
            "model_name": self.model_name,
            "task": self.task,
            "group": self.group,
            "episodes": None if self.episode_ids is None else list(self.episode_ids),
        }
        return {k: v for k, v in out.items() if v is not None}
