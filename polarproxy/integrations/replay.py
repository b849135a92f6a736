"""Recorded rows replayed by group: what a trainer's rollout hook returns instead of generating."""

from __future__ import annotations

from collections import Counter
from typing import Any


class GroupReplay:
    """The rows of each group (in file order), handed out one after another, from the start again once a
    group's rows are used up (a new epoch)."""

    def __init__(self, groups: dict[str, list[dict[str, Any]]], hint: str) -> None:
        self.groups = groups
        self._hint = hint  # how to ask for a group that is there
        self._served: Counter[str] = Counter()

    def next(self, group: str) -> dict[str, Any]:
        rows = self.groups.get(group)
        if rows is None:
            raise KeyError(f"group {group!r} is not in the replayed rows; {self._hint}")
        row = rows[self._served[group] % len(rows)]
        self._served[group] += 1
        return row
