"""Linear-size token storage: which earlier call a new prompt is stored against, and how much of it.

A prompt is stored as `full_sequence(base)[:base_len] + tail` (schema.py). Each `Store` remembers, per
episode, the token sequences of the calls it wrote most recently (prompt, then prompt + output once the
call finished), packed as in the database, and only after the transaction that wrote them committed. A
new prompt is compared with them (and with the base the capture layer names, T2): the candidate sharing
the longest prefix becomes the base. The comparison is over packed bytes (memcmp speed), so the choice is
verified token for token: a reference is stored only for tokens that are equal, never on trust (T1).

Memory is bounded: `CANDIDATES_PER_EPISODE` calls per episode, and `CACHE_BYTES` over all episodes
(least recently used episodes are forgotten first). A forgotten call can still be a base; it is then read
back from the database.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

CANDIDATES_PER_EPISODE = 8
CACHE_BYTES = 128 * 1024 * 1024
# Below this many shared tokens a reference saves less than it costs (a call ID and a length per row).
MIN_SHARED_TOKENS = 8
_BLOCK = 1 << 16  # bytes compared per step while looking for the first difference


@dataclass(slots=True)
class Known:
    """A call's token sequence as committed: its prompt, plus its output once it finished."""

    call_id: str
    episode_id: str
    full: bytes  # packed int32 IDs: prompt (+ output)
    prompt_len: int  # tokens
    output_len: int | None  # tokens; None while the call is in flight
    bodies: tuple[str, str | None] = ("", None)  # request body and conversation JSON, as read back

    @property
    def size(self) -> int:
        return len(self.full) + len(self.bodies[0]) + len(self.bodies[1] or "")


@dataclass(slots=True, frozen=True)
class Base:
    """A verified reference: the first `length` tokens of the prompt equal `full_sequence(call)[:length]`."""

    call_id: str
    length: int
    prompt_len: int  # of the base call, as known when chosen (checked again inside the write transaction)
    output_len: int | None


def shared_prefix_bytes(a: bytes, b: bytes) -> int:
    """The length of the longest common prefix of `a` and `b`, in bytes."""
    n = min(len(a), len(b))
    if a.startswith(b[:n]):
        return n
    lo = 0
    while lo + _BLOCK <= n and a.startswith(b[lo : lo + _BLOCK], lo):
        lo += _BLOCK
    hi = min(lo + _BLOCK, n)  # a[:lo] == b[:lo], and the first difference is before hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a.startswith(b[lo:mid], lo):
            lo = mid
        else:
            hi = mid
    return lo


def shared_prefix_tokens(a: bytes, b: bytes) -> int:
    """How many leading int32 tokens two packed arrays share."""
    return shared_prefix_bytes(a, b) // 4


def choose_base(
    prompt: bytes, candidates: list[Known], *, hint: str | None, hint_len: int | None
) -> Base | None:
    """The candidate sharing the longest prefix with `prompt` (at least MIN_SHARED_TOKENS tokens).

    A named `hint` whose whole sequence (or its first `hint_len` tokens) starts the prompt is taken at once:
    that is the T2 case, `earlier prompt + earlier output + new`. Ties go to the earlier candidate in the
    list (the hint, then the most recent call)."""
    best: Base | None = None
    for known in candidates:
        if known.call_id == hint:
            want = len(known.full) // 4 if hint_len is None else hint_len
            if 0 < want <= len(known.full) // 4 and prompt.startswith(known.full[: 4 * want]):
                return Base(known.call_id, want, known.prompt_len, known.output_len)
        n = shared_prefix_tokens(prompt, known.full)
        if n >= MIN_SHARED_TOKENS and (best is None or n > best.length):
            best = Base(known.call_id, n, known.prompt_len, known.output_len)
    return best


class RecentCalls:
    """Per episode, the committed token sequences of the most recent calls (thread-safe, bounded)."""

    def __init__(self, per_episode: int = CANDIDATES_PER_EPISODE, budget_bytes: int = CACHE_BYTES) -> None:
        self.per_episode = per_episode
        self.budget_bytes = budget_bytes
        self._episodes: OrderedDict[str, OrderedDict[str, Known]] = OrderedDict()
        self._episode_of: dict[str, str] = {}  # call ID -> episode ID, for the calls remembered
        self._bytes = 0
        self._lock = threading.Lock()

    def candidates(self, episode_id: str) -> list[Known]:
        """The episode's remembered calls, most recent first."""
        with self._lock:
            calls = self._episodes.get(episode_id)
            return list(reversed(calls.values())) if calls else []

    def get(self, episode_id: str, call_id: str) -> Known | None:
        with self._lock:
            calls = self._episodes.get(episode_id)
            return None if calls is None else calls.get(call_id)

    def began(self, episode_id: str, call_id: str, prompt: bytes, bodies: tuple[str, str | None]) -> None:
        self._put(Known(call_id, episode_id, prompt, len(prompt) // 4, None, bodies))

    def finished(self, call_id: str, output: bytes) -> None:
        """Append the output of a call this store began (a call it does not remember is ignored)."""
        with self._lock:
            episode_id = self._episode_of.get(call_id)
            calls = None if episode_id is None else self._episodes.get(episode_id)
            known = None if calls is None else calls.get(call_id)
            if known is None:
                return
            self._bytes += len(output) - (len(known.full) - 4 * known.prompt_len)
            known.full = known.full[: 4 * known.prompt_len] + output
            known.output_len = len(output) // 4
            self._trim()

    def _put(self, known: Known) -> None:
        with self._lock:
            calls = self._episodes.setdefault(known.episode_id, OrderedDict())
            self._episodes.move_to_end(known.episode_id)
            old = calls.pop(known.call_id, None)
            if old is not None:
                self._drop(old)
            calls[known.call_id] = known
            self._episode_of[known.call_id] = known.episode_id
            self._bytes += known.size
            while len(calls) > self.per_episode:
                _, dropped = calls.popitem(last=False)
                self._drop(dropped)
            self._trim()

    def _drop(self, known: Known) -> None:
        self._bytes -= known.size
        self._episode_of.pop(known.call_id, None)

    def _trim(self) -> None:
        while self._bytes > self.budget_bytes and len(self._episodes) > 1:
            _, calls = self._episodes.popitem(last=False)
            for known in calls.values():
                self._drop(known)
