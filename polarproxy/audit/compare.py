"""Comparison of two token sequences: the recorded prompt and a fresh re-render of the same conversation.

Definitions (docs/usage.md, "Drift audit"):

- `first_diff`: the first position where the two differ; when one is a prefix of the other, the shorter
  one's length. None when they are identical.
- `drifted_tokens`: recorded tokens at or after `first_diff`. Every one of them sits in a context a
  re-rendered prompt gets wrong (or is missing from it): a trainer fed the re-render would score them
  under a prefix the model never saw.
- `changed_recorded` / `changed_fresh`: the lengths of the differing middle spans once the common prefix
  and the common suffix are taken off (the common suffix never overlaps the common prefix). For one
  dropped reasoning block, `changed_recorded` is its length and `changed_fresh` is 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TokenDiff:
    recorded_tokens: int
    fresh_tokens: int
    first_diff: int | None
    common_suffix: int

    @property
    def identical(self) -> bool:
        return self.first_diff is None

    @property
    def drifted_tokens(self) -> int:
        return 0 if self.first_diff is None else self.recorded_tokens - self.first_diff

    @property
    def changed_recorded(self) -> int:
        return 0 if self.first_diff is None else self.recorded_tokens - self.first_diff - self.common_suffix

    @property
    def changed_fresh(self) -> int:
        return 0 if self.first_diff is None else self.fresh_tokens - self.first_diff - self.common_suffix


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    lo = 0
    step = 4096  # compare slices first: C-speed for the long equal stretches, a loop only inside one
    while lo + step <= n and a[lo : lo + step] == b[lo : lo + step]:
        lo += step
    while lo < n and a[lo] == b[lo]:
        lo += 1
    return lo


def compare(recorded: Sequence[int], fresh: Sequence[int]) -> TokenDiff:
    recorded, fresh = list(recorded), list(fresh)
    if recorded == fresh:
        return TokenDiff(len(recorded), len(fresh), None, 0)
    p = common_prefix(recorded, fresh)
    room = min(len(recorded), len(fresh)) - p
    s = 0
    while s < room and recorded[-1 - s] == fresh[-1 - s]:
        s += 1
    return TokenDiff(len(recorded), len(fresh), p, s)
