"""What every family's output parser shares: the events it writes, and a small state machine to drive.

A family parser reads the model's text (after reasoning is split off) and writes text and tool calls to an
`Output`, which turns them into stream events and, at the end, the `Completion`. Because the completion is
built from the very events that were streamed, the streamed deltas add up to it exactly.

A tool call is *committed* once its header is parsed (its name, and arguments that start as a JSON
object): from then on its arguments stream as `ToolCallDelta`s and it stays a call even if the output is
cut short (as a provider's API does at `max_tokens`). Markup that does not parse before that point is
returned as text, never raised.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Protocol

from polarproxy.conversation import (
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    Tool,
    ToolCall,
    ToolCallDelta,
    ToolCallEvent,
)


def partial_suffix(buf: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `buf` that is a proper prefix of one of `tags`."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(buf)), best, -1):
            if buf.endswith(tag[:k]):
                best = k
                break
    return best


def find_first(buf: str, tags: tuple[str, ...], start: int = 0) -> tuple[int, str]:
    """The earliest occurrence of any of `tags` in `buf` (the longest tag on a tie), or (-1, "")."""
    best, which = -1, ""
    for tag in tags:
        i = buf.find(tag, start)
        if i >= 0 and (best < 0 or i < best or (i == best and len(tag) > len(which))):
            best, which = i, tag
    return best, which


def could_start(buf: str, tags: tuple[str, ...]) -> bool:
    """Whether `buf` (already left-stripped) is empty or a proper prefix of one of `tags`."""
    return any(tag.startswith(buf) and tag != buf for tag in tags)


def json_escape(text: str) -> str:
    """`text` as the inside of a JSON string. Escaping is per character, so escaped pieces concatenate to
    the escaped whole."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


class _Trimmed:
    """A text channel whose leading and trailing whitespace is dropped, emitted incrementally: whitespace
    is held back until something follows it."""

    def __init__(self, make: Callable[[str], StreamEvent]) -> None:
        self.make = make
        self.started = False
        self.held = ""
        self.value = ""

    def push(self, text: str) -> list[StreamEvent]:
        if not text:
            return []
        if not self.started:
            text = text.lstrip()
            if not text:
                return []
            self.started = True
        stripped = text.rstrip()
        if not stripped:
            self.held += text
            return []
        out = self.held + stripped
        self.held = text[len(stripped) :]
        self.value += out
        return [self.make(out)]


class Output:
    """Where a parser writes: reasoning, text and tool calls become stream events, collected until taken."""

    def __init__(self, new_call_id: Callable[[], str]) -> None:
        self._new_id = new_call_id
        self.events: list[StreamEvent] = []
        self._text = _Trimmed(TextDelta)
        self._reasoning = _Trimmed(ReasoningDelta)
        self.saw_reasoning = False
        self.calls: list[ToolCall] = []
        self._open: tuple[int, str, str] | None = None  # index, id, name of the call being streamed
        self._args: list[str] = []

    def text(self, text: str) -> None:
        self.events += self._text.push(text)

    def reasoning(self, text: str) -> None:
        self.saw_reasoning = True
        self.events += self._reasoning.push(text)

    @property
    def text_value(self) -> str:
        return self._text.value

    @property
    def reasoning_value(self) -> str | None:
        return self._reasoning.value if self.saw_reasoning else None

    @property
    def in_call(self) -> bool:
        return self._open is not None

    def open_call(self, name: str) -> None:
        """Commit a call: its id and name go out now, its arguments as they are parsed."""
        assert self._open is None, "a tool call is already open"
        self._open = (len(self.calls), self._new_id(), name)
        self._args = []
        self.events.append(ToolCallDelta(*self._open, arguments=""))

    def args(self, piece: str) -> None:
        if piece:
            assert self._open is not None, "no tool call is open"
            self._args.append(piece)
            self.events.append(ToolCallDelta(*self._open, arguments=piece))

    def close_call(self) -> None:
        assert self._open is not None, "no tool call is open"
        index, call_id, name = self._open
        call = ToolCall(id=call_id, name=name, arguments="".join(self._args))
        self.calls.append(call)
        self.events.append(ToolCallEvent(index=index, call=call))
        self._open, self._args = None, []

    def whole_call(self, name: str, arguments: str) -> None:
        """A call parsed at once (its end was needed to know it is one): a single `ToolCallEvent`."""
        assert self._open is None, "a tool call is already open"
        call = ToolCall(id=self._new_id(), name=name, arguments=arguments)
        self.calls.append(call)
        self.events.append(ToolCallEvent(index=len(self.calls) - 1, call=call))

    def take(self) -> list[StreamEvent]:
        events, self.events = self.events, []
        return events


class ToolParser(Protocol):
    """One model family's tool-call format. Text goes in as it is sampled; everything goes to `out`."""

    out: Output

    def __init__(self, out: Output, tools: list[Tool]) -> None: ...

    def feed(self, text: str) -> None: ...

    def finish(self) -> None:
        """The output ended: flush what is held; an open call is closed as it stands."""
        ...


class JsonValue:
    """Finds, incrementally, where a JSON object or array ends, given the text from its first bracket.

    `scan(text, pos)` returns `(end, done)`: `done` when the value closed (`end` just past its bracket) or
    when a `<` appears outside a string (`end` at the `<`; `broken` is set), which no JSON allows and which
    is where each family's closing markup begins. Otherwise `end == len(text)` and it waits for more."""

    _STRUCT = re.compile(r'["{}\[\]<]')
    _IN_STRING = re.compile(r'["\\]')

    def __init__(self, depth: int = 0) -> None:
        self.depth = depth
        self.in_string = False
        self.escaped = False
        self.broken = False

    def scan(self, text: str, pos: int = 0) -> tuple[int, bool]:
        n = len(text)
        while pos < n:
            if self.escaped:
                self.escaped = False
                pos += 1
                continue
            if self.in_string:
                m = self._IN_STRING.search(text, pos)
                if m is None:
                    return n, False
                pos = m.end()
                if m.group() == "\\":
                    self.escaped = True
                else:
                    self.in_string = False
                continue
            m = self._STRUCT.search(text, pos)
            if m is None:
                return n, False
            c, pos = m.group(), m.start()
            if c == "<":
                self.broken = True
                return pos, True
            pos += 1
            if c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth <= 0:
                    return pos, True
        return n, False


# `{"name": "NAME", "arguments": {` (or "parameters"): the header of a JSON tool call, through the `{` that
# opens its arguments. Group 1: the name as JSON string content.
JSON_CALL_HEADER = re.compile(
    r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{)'
)


def header_name(raw: str) -> str | None:
    try:
        name = json.loads('"' + raw + '"')
    except ValueError:
        return None
    return name if isinstance(name, str) and name else None


def call_from_object(obj: Any) -> tuple[str, str] | None:
    """(name, arguments JSON text) of a `{"name": ..., "arguments" | "parameters": ...}` object, or None.
    Arguments given as a string are taken as the JSON text they hold."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        return obj["name"], args
    if not isinstance(args, dict):
        return None
    return obj["name"], json.dumps(args, ensure_ascii=False)


class Machine:
    """A parser as a state machine over a buffer: method `on_<mode>` handles the buffer next.

    Each step consumes what it can and returns True to run again, or False to wait for more text. `raw`
    keeps the markup consumed since the last committed call, so markup that turns out not to be a call is
    returned as text exactly as sampled (`as_text`)."""

    mode = "text"

    def __init__(self, out: Output, tools: list[Tool]) -> None:
        self.out = out
        self.tools = {t.name: t for t in tools}
        self.buf = ""
        self.raw = ""
        self._scanner = JsonValue()
        self._after_args = "text"
        self._object = JsonValue()  # a call object read whole (`whole_call`)
        self._scanned = 0

    def feed(self, text: str) -> None:
        self.buf += text
        while self.buf and getattr(self, "on_" + self.mode)():
            pass

    # -- helpers --------------------------------------------------------------------------------

    def take(self, n: int) -> None:
        """Consume `n` characters of markup (kept in `raw` until a call is committed)."""
        self.raw += self.buf[:n]
        self.buf = self.buf[n:]

    def drop(self, n: int) -> None:
        self.buf = self.buf[n:]

    def as_text(self) -> bool:
        """The markup taken so far is text after all; the buffer is read again as text."""
        self.out.text(self.raw)
        self.raw = ""
        self.mode = "text"
        return True

    def text_until(self, tags: tuple[str, ...]) -> str | None:
        """Emit text up to the first of `tags` and take the tag (returned); None: all text is out but a
        partial tag, which is held."""
        i, tag = find_first(self.buf, tags)
        if i >= 0:
            self.out.text(self.buf[:i])
            self.drop(i)
            self.raw = ""
            self.take(len(tag))
            return tag
        keep = partial_suffix(self.buf, tags)
        self.out.text(self.buf[: len(self.buf) - keep])
        self.buf = self.buf[len(self.buf) - keep :]
        return None

    def commit(self, name: str, at: int, after: str) -> None:
        """Open call `name`; its JSON arguments start at `buf[at]` and stream in mode "args"; `after` is the
        mode for what follows them."""
        self.out.open_call(name)
        self.raw = ""
        self.drop(at)
        self._scanner = JsonValue()
        self._after_args = after
        self.mode = "args"

    def start_object(self) -> None:
        """A JSON call object starts at `buf[0]`: read it with `whole_call` (unless its header streams)."""
        self._object = JsonValue()
        self._scanned = 0

    def whole_call(self, after: str) -> bool:
        """Scan the call object begun with `start_object` to its end; a `{"name", "arguments"|"parameters"}`
        object is one call (then mode `after`), anything else is text. False: wait for more."""
        end, done = self._object.scan(self.buf, self._scanned)
        self._scanned = end
        if not done:
            return False
        parsed = None
        if not self._object.broken:
            try:
                parsed = call_from_object(json.loads(self.buf[:end]))
            except ValueError:
                parsed = None
        if parsed is None:
            return self.as_text()
        self.out.whole_call(*parsed)
        self.raw = ""
        self.drop(end)
        self.mode = after
        return True

    def on_args(self) -> bool:
        end, done = self._scanner.scan(self.buf)
        self.out.args(self.buf[:end])
        self.drop(end)
        if not done:
            return False
        self.out.close_call()
        self.mode = self._after_args
        return True

    def finish(self) -> None:
        """The output ended: what is held is flushed, markup that is no call is text, an open call closes."""
        while self.mode != "text" or self.buf:
            if self.mode == "text":
                self.feed("")
                if self.mode == "text":
                    self.out.text(self.buf)
                    self.buf = ""
            elif self.mode == "args":
                self.out.args(self.buf)
                self.buf = ""
                self.out.close_call()
                self.mode = self._after_args
            else:
                self.finish_markup()
                assert self.mode == "text", f"{type(self).__name__}.finish_markup left mode {self.mode!r}"
        if self.out.in_call:
            self.out.close_call()

    def finish_markup(self) -> None:
        """The output ended in markup (a mode other than text and args). It must leave mode "text": the
        buffer left then is read as text. By default the markup is text; a family closes its open call."""
        if self.out.in_call:
            self.buf = ""
            self.mode = "text"
        else:
            self.as_text()
