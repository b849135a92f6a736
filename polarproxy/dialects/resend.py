"""Harnesses resend the whole history with every call: parse only the messages a request adds.

Request n+1 of an episode is, byte for byte, request n up to the end of its last message, then the new
messages, then the same tail (`{"model": ..., "messages": [..., NEW], "tools": [...]}`). `ResentBodies`
keeps, per episode, the last request's bytes, where its messages array sits, where each element ends, and
the `Message`s they parsed to. The next request's array is compared with that one (memcmp, at whatever
offset the array starts now): each element that ends inside the common bytes is the same JSON, so it gives
the same `Message`s, and the earlier objects are reused. Only the elements after the common bytes are
scanned (to find where each ends) and parsed. The body's other members are parsed as a small object of
their own (the body with its messages member cut out), or, when their bytes are the same as before too,
taken from the earlier conversation (Claude Code's tools are ~74 KB of its 87 KB requests).

Dialects opt in (`Resendable`) where each element of the array reads alone: OpenAI Chat Completions (one
message an element) and Anthropic Messages (a user turn's tool results are several; the system prompt leads).
Gemini pairs function responses with the calls of earlier turns, and Responses merges items into turns, so
they are parsed whole. Claude Code moves its cache breakpoint to the newest message with every request, so
there the last message of the earlier request is parsed again.

The result equals the whole parse's (tests/dialects/test_resend.py holds the two equal over appended and
edited messages, whitespace, escapes, key orders, captured harness traffic and hostile shapes). Whatever this
module does not read plainly goes to the whole parse, which gives the authoritative conversation or error:
a body that is not an object, a messages member that is not an array of objects, a duplicate messages key,
invalid JSON, any DialectError.

Why (measured, docs/benchmarks-history.md): at 32k tokens a request is ~78 KB and ~128 messages. Its whole parse
and the T2 check that compares every message with the earlier call's were a third of what a long request
cost the proxy beyond a short one. A reused `Message` is the same object as the earlier call's, so that
check is an identity test, and the T2 index's recent calls of an episode share their messages instead of
holding a copy of the history each.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Protocol

import orjson

from polarproxy.conversation import Conversation, Message
from polarproxy.dialects.base import Dialect, DialectError

# The bodies of as many episodes as the T2 index remembers (render/prefix.py MAX_EPISODES), one for each
# conversation an episode interleaves, up to BODIES_PER_EPISODE (~78 KB each at 32k tokens), and at most
# MAX_BYTES in all. The index's recent calls share their messages.
MAX_EPISODES = 256
BODIES_PER_EPISODE = 4
MAX_BYTES = 64 * 1024 * 1024
# Smaller bodies are parsed whole: this path's fixed cost (~0.03 ms: the comparison, the scan of the new
# messages, two small parses) is what the whole parse of ~12 KB costs (measured with bench/long_context.py's
# bodies; the whole parse of a 32k-token request's 108 KB: 0.26 ms, this path: 0.03 ms).
MIN_BYTES = 16384

_WS = re.compile(rb"[ \t\n\r]*")
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_SCALAR = re.compile(rb"[^,\]}\s]+")
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_QUOTE, _COMMA, _COLON, _OPEN, _CLOSE, _OBJECT, _END = b'",:[]{}'


class Resendable(Protocol):
    """A dialect whose conversation's messages come from one top-level array (`messages_key`), each element
    read alone, after any messages the body's other members lead with (a system prompt)."""

    messages_key: str

    def parse_element(self, raw: Any, i: int) -> list[Message]:
        """The messages element `i` of the array stands for."""
        ...

    def conversation(self, body: dict[str, Any], messages: list[Message]) -> Conversation:
        """The conversation of a body whose array's elements gave `messages` (the body's other members read
        here, not its array): any messages they lead with, then `messages`."""
        ...


class _Unscannable(Exception):
    """Not a shape this module reads: the whole parse decides."""


@dataclass(slots=True, frozen=True)
class _Layout:
    """Where a body's messages member sits, and what its elements parsed to."""

    body: bytes
    key_start: int  # the member's key
    comma_before: int | None  # the comma before the member; None when it is the first member
    array_start: int  # just past the array's '['
    ends: list[int]  # just past each element, counted from array_start
    close: int  # the array's ']'
    messages: list[Message]  # what the elements parsed to
    counts: list[int]  # how many of them elements 0..i gave
    conversation: Conversation  # what the body parsed to: messages it leads with, then `messages`


def parse_whole(dialect: Dialect, content: bytes, *, path: str, query: dict[str, str]) -> Conversation:
    """A request body parsed as it stands; raises DialectError."""
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError as e:
        raise DialectError(f"The request body is not valid JSON: {e}.") from e
    return dialect.parse(body, path=path, query=query)


class ResentBodies:
    """The last long request bodies of each recent episode, to parse the next one's new messages only.

    An episode may interleave conversations (a harness's subagents, its side calls), so up to
    `per_episode` bodies are kept for each: a request is read against the one it shares the most messages
    with, and its body takes that one's place (or the oldest's, when it shares none). Bounded by episodes
    (least recently used forgotten first) and by the bytes of the bodies kept."""

    def __init__(
        self,
        *,
        max_episodes: int = MAX_EPISODES,
        per_episode: int = BODIES_PER_EPISODE,
        max_bytes: int = MAX_BYTES,
        min_bytes: int = MIN_BYTES,
    ) -> None:
        self.max_episodes = max_episodes
        self.per_episode = per_episode
        self.max_bytes = max_bytes
        self.min_bytes = min_bytes
        self._layouts: OrderedDict[str, list[_Layout]] = OrderedDict()
        self._bytes = 0  # of the bodies kept
        self.reused = 0  # messages taken from an earlier body, and messages parsed, by this path (tests and
        self.parsed = 0  # benchmarks read them)

    @property
    def bytes_kept(self) -> int:
        return self._bytes

    def parse(
        self, dialect: Dialect, episode_id: str, content: bytes, *, path: str, query: dict[str, str]
    ) -> Conversation:
        """`content` parsed as `dialect.parse` would (the same conversation, or the same DialectError)."""
        key = getattr(dialect, "messages_key", None)
        if key is None or len(content) < self.min_bytes:
            return parse_whole(dialect, content, path=path, query=query)
        kept = self._layouts.get(episode_id, [])
        try:
            conv, layout, reused, base = _parse(dialect, key, kept, content)  # type: ignore[arg-type]
        except (_Unscannable, IndexError, orjson.JSONDecodeError, DialectError):
            return parse_whole(dialect, content, path=path, query=query)  # what is kept stays valid
        self.reused += reused
        self.parsed += len(layout.messages) - reused
        self._keep(episode_id, [layout, *(k for i, k in enumerate(kept) if i != base)][: self.per_episode])
        return conv

    def _keep(self, episode_id: str, kept: list[_Layout]) -> None:
        layouts = self._layouts
        self._bytes += sum(len(k.body) for k in kept) - sum(len(k.body) for k in layouts.get(episode_id, ()))
        layouts[episode_id] = kept
        layouts.move_to_end(episode_id)
        while len(layouts) > 1 and (len(layouts) > self.max_episodes or self._bytes > self.max_bytes):
            _, gone = layouts.popitem(last=False)
            self._bytes -= sum(len(k.body) for k in gone)


def _parse(
    dialect: Resendable, key: str, kept: list[_Layout], content: bytes
) -> tuple[Conversation, _Layout, int, int | None]:
    """The conversation, its layout, how many messages it reused, and which of `kept` it reused them from."""
    where = next(
        (
            (k.key_start, k.comma_before, k.array_start)
            for k in kept
            if content.startswith(memoryview(k.body)[: k.array_start])
        ),
        None,
    )
    key_start, comma_before, start = where if where is not None else _locate(content, key)
    base, reused = None, 0
    for i, k in enumerate(kept):
        if k.ends and len(k.ends) > reused:
            same = _common(content, start, memoryview(k.body)[k.array_start : k.array_start + k.ends[-1]])
            n = bisect_right(k.ends, same)
            if n > reused:
                base, reused = i, n
    old = kept[base] if base is not None else None
    if old is not None:
        first, ends, close = _elements(content, start + old.ends[reused - 1], after_element=True)
    else:
        first, ends, close = _elements(content, start, after_element=False)
    raw = orjson.loads(b"[" + content[first : close + 1]) if ends else []
    if len(raw) != len(ends):
        raise _Unscannable
    if old is not None:
        n = old.counts[reused - 1]
        messages, counts = old.messages[:n], old.counts[:reused]
    else:
        n, messages, counts = 0, [], []
    parse_element = dialect.parse_element
    for i, m in enumerate(raw, reused):
        got = parse_element(m, i)
        messages += got
        n += len(got)
        counts.append(n)
    prev = old if old is not None else (kept[0] if kept else None)  # the latest, when none shares messages
    if (
        prev is not None
        and messages
        and len(content) - close == len(prev.body) - prev.close
        and content.endswith(memoryview(prev.body)[prev.close :])
        and content.startswith(memoryview(prev.body)[: prev.array_start])
    ):  # the other members are the same bytes: the same tools, sampling and model (shared, never changed)
        earlier = prev.conversation
        lead = earlier.messages[: len(earlier.messages) - len(prev.messages)]
        conv = replace(earlier, messages=lead + messages)
    else:
        if comma_before is not None:
            rest = content[:comma_before] + content[close + 1 :]
        else:
            after = _skip(content, close + 1)
            rest = content[:key_start] + content[after + 1 if content[after] == _COMMA else close + 1 :]
        body = orjson.loads(rest)
        if not isinstance(body, dict) or key in body:  # a duplicate key: the whole parse takes the last one
            raise _Unscannable
        conv = dialect.conversation(body, messages)
        if len(conv.messages) < len(messages) or (messages and conv.messages[-1] is not messages[-1]):
            raise _Unscannable  # not the dialect's messages last: nothing to reuse from it
    offsets = old.ends[:reused] if old is not None else []
    offsets += [e - start for e in ends]
    layout = _Layout(content, key_start, comma_before, start, offsets, close, list(messages), counts, conv)
    return conv, layout, counts[reused - 1] if reused else 0, base


def _common(new: bytes, at: int, old: memoryview) -> int:
    """How many leading bytes of `old` are found at `new[at:]`."""
    if new.startswith(old, at):
        return len(old)
    lo, hi = 0, len(old)  # old[:lo] is there, old[:hi] is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if new.startswith(old[lo:mid], at + lo):
            lo = mid
        else:
            hi = mid
    return lo


def _skip(buf: bytes, p: int) -> int:
    return _WS.match(buf, p).end()  # type: ignore[union-attr]


def _locate(buf: bytes, key: str) -> tuple[int, int | None, int]:
    """The top-level member `key` of the object in `buf`: (where its key starts, the comma before it or
    None, just past its array's '[')."""
    raw_key = orjson.dumps(key)
    p = _skip(buf, 0)
    if buf[p] != _OBJECT:
        raise _Unscannable
    p = _skip(buf, p + 1)
    comma = None
    while True:
        m = _STRING.match(buf, p)
        if m is None:
            raise _Unscannable
        key_start, name = p, m.group()
        p = _skip(buf, m.end())
        if buf[p] != _COLON:
            raise _Unscannable
        p = _skip(buf, p + 1)
        if name == raw_key or (b"\\" in name and orjson.loads(name) == key):
            if buf[p] != _OPEN:
                raise _Unscannable
            return key_start, comma, p + 1
        p = _skip(buf, _value_end(buf, p))
        if buf[p] != _COMMA:
            raise _Unscannable  # no such member: the whole parse says so
        comma = p
        p = _skip(buf, p + 1)


def _value_end(buf: bytes, p: int) -> int:
    c = buf[p]
    if c in (_OBJECT, _OPEN):
        return _nested_end(buf, p)
    m = (_STRING if c == _QUOTE else _SCALAR).match(buf, p)
    if m is None:
        raise _Unscannable
    return m.end()


def _nested_end(buf: bytes, p: int) -> int:
    """Just past the object or array that starts at buf[p]."""
    depth = 0
    for m in _TOKENS.finditer(buf, p):
        c = buf[m.start()]
        if c == _QUOTE:
            continue
        if c in (_OBJECT, _OPEN):
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return m.end()
    raise _Unscannable


def _elements(buf: bytes, p: int, *, after_element: bool) -> tuple[int, list[int], int]:
    """The elements of the array from `p` (just past its '[', or just past an element): where the first
    starts, where each ends, and where the array's ']' is. Every element must be an object."""
    ends: list[int] = []
    p = _skip(buf, p)
    if buf[p] == _CLOSE:
        return p, ends, p
    if after_element:
        if buf[p] != _COMMA:
            raise _Unscannable
        p = _skip(buf, p + 1)
    first = p
    while True:
        if buf[p] != _OBJECT:
            raise _Unscannable  # a message that is not an object: the whole parse names it
        p = _nested_end(buf, p)
        ends.append(p)
        p = _skip(buf, p)
        c = buf[p]
        if c == _CLOSE:
            return first, ends, p
        if c != _COMMA:
            raise _Unscannable
        p = _skip(buf, p + 1)
