"""Parse sampled text into reasoning, text and tool calls, incrementally, as tokens arrive.

Formats (DESIGN.md §4): reasoning in `<think>...</think>`; hermes tool calls
`<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`. A tool call that does not parse is
returned as text, never raised. Whitespace around reasoning and text is trimmed, and the streamed deltas
add up to exactly the final `Completion` fields: whitespace is held back until something follows it.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from polarproxy.conversation import (
    Completion,
    FinishReason,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    Usage,
)

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"


def _partial_suffix(buf: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `buf` that is a proper prefix of one of `tags`."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(buf)), 0, -1):
            if k > best and buf.endswith(tag[:k]):
                best = k
                break
    return best


def parse_tool_call(body: str, call_id: str) -> ToolCall | None:
    """The JSON between the tool-call tags, or None when it is not a `{"name", "arguments"}` object."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCall(id=call_id, name=obj["name"], arguments=arguments)


class _Trimmed:
    """A text channel whose leading and trailing whitespace is dropped, emitted incrementally."""

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


class OutputParser:
    """`feed(text) -> events`; `finish(finish_reason, usage) -> (events, Completion)`."""

    def __init__(self, *, new_call_id: Callable[[], str], reasoning_open: bool = False) -> None:
        self._new_id = new_call_id
        self._buf = ""
        self._mode = "think" if reasoning_open else "start"  # start | think | text | call
        self._call_body = ""
        self._reasoning = _Trimmed(ReasoningDelta)
        self._text = _Trimmed(TextDelta)
        self._calls: list[ToolCall] = []
        self._saw_reasoning = reasoning_open

    def feed(self, text: str) -> list[StreamEvent]:
        self._buf += text
        events: list[StreamEvent] = []
        while self._buf:
            progressed = self._step(events)
            if not progressed:
                break
        return events

    def _step(self, events: list[StreamEvent]) -> bool:
        buf = self._buf
        if self._mode == "start":
            stripped = buf.lstrip()
            if not stripped:
                return False
            if stripped.startswith(THINK_OPEN):
                self._buf = stripped[len(THINK_OPEN) :]
                self._mode = "think"
                self._saw_reasoning = True
                return True
            if THINK_OPEN.startswith(stripped):
                return False  # could still become <think>
            self._mode = "text"
            return True
        if self._mode == "think":
            idx = buf.find(THINK_CLOSE)
            if idx >= 0:
                events += self._reasoning.push(buf[:idx])
                self._buf = buf[idx + len(THINK_CLOSE) :]
                self._mode = "text"
                return True
            keep = _partial_suffix(buf, (THINK_CLOSE,))
            events += self._reasoning.push(buf[: len(buf) - keep])
            self._buf = buf[len(buf) - keep :]
            return False
        if self._mode == "text":
            idx = buf.find(CALL_OPEN)
            if idx >= 0:
                events += self._text.push(buf[:idx])
                self._buf = buf[idx + len(CALL_OPEN) :]
                self._mode = "call"
                self._call_body = ""
                return True
            keep = _partial_suffix(buf, (CALL_OPEN,))
            events += self._text.push(buf[: len(buf) - keep])
            self._buf = buf[len(buf) - keep :]
            return False
        # call: accumulate the body; search only the part that could hold a new closing tag
        scan_from = max(0, len(self._call_body) - len(CALL_CLOSE) + 1)
        self._call_body += buf
        self._buf = ""
        idx = self._call_body.find(CALL_CLOSE, scan_from)
        if idx < 0:
            return False
        body = self._call_body[:idx]
        self._buf = self._call_body[idx + len(CALL_CLOSE) :]
        self._call_body = ""
        self._mode = "text"
        call = parse_tool_call(body.strip(), self._new_id())
        if call is None:
            events += self._text.push(CALL_OPEN + body + CALL_CLOSE)
        else:
            self._calls.append(call)
            events.append(ToolCallEvent(index=len(self._calls) - 1, call=call))
        return True

    def finish(
        self, finish_reason: FinishReason, usage: Usage | None = None
    ) -> tuple[list[StreamEvent], Completion]:
        """Flush what is held back. An unclosed `<think>` stays reasoning; an unclosed tool call is text."""
        events: list[StreamEvent] = []
        rest = self._buf
        self._buf = ""
        if self._mode == "think":
            events += self._reasoning.push(rest)
        elif self._mode == "call":
            events += self._text.push(CALL_OPEN + self._call_body + rest)
            self._call_body = ""
        else:
            events += self._text.push(rest)
        if finish_reason == "stop" and self._calls:
            finish_reason = "tool_calls"
        completion = Completion(
            text=self._text.value,
            reasoning=self._reasoning.value if self._saw_reasoning else None,
            tool_calls=list(self._calls),
            finish_reason=finish_reason,
            usage=usage or Usage(),
        )
        return events, completion


def parse_output(
    text: str, *, new_call_id: Callable[[], str], finish_reason: FinishReason = "stop"
) -> Completion:
    """Parse a whole sampled text at once (same result as feeding it in pieces)."""
    parser = OutputParser(new_call_id=new_call_id)
    parser.feed(text)
    return parser.finish(finish_reason)[1]
