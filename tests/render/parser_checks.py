"""Checks every family parser's tests share: a text parsed whole, and the same text streamed in pieces
split at every character offset, give the same completion, and the streamed deltas add up to it."""

from __future__ import annotations

import itertools
from typing import Any

from polarproxy.conversation import (
    Completion,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    Tool,
    ToolCallDelta,
    ToolCallEvent,
)
from polarproxy.render.output_parser import OutputParser, parse_output


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def run(pieces: list[str], **kw: Any) -> tuple[list[StreamEvent], Completion]:
    finish_reason = kw.pop("finish_reason", "stop")
    parser = OutputParser(new_call_id=ids(), **kw)
    events: list[StreamEvent] = []
    for p in pieces:
        events += parser.feed(p)
    tail, completion = parser.finish(finish_reason)
    return events + tail, completion


def assert_deltas_add_up(events: list[StreamEvent], c: Completion) -> None:
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == c.text
    assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == (c.reasoning or "")
    closed = [e for e in events if isinstance(e, ToolCallEvent)]
    assert [e.call for e in closed] == c.tool_calls
    assert [e.index for e in closed] == list(range(len(c.tool_calls)))
    for i, call in enumerate(c.tool_calls):
        deltas = [e for e in events if isinstance(e, ToolCallDelta) and e.index == i]
        if not deltas:
            continue
        assert {(d.id, d.name) for d in deltas} == {(call.id, call.name)}
        assert "".join(d.arguments for d in deltas) == call.arguments
        assert events.index(deltas[-1]) < events.index(closed[i])
        assert call.arguments.lstrip().startswith("{")  # streamed arguments are JSON-object text


def parse_every_split(text: str, **kw: Any) -> Completion:
    """The completion of `text`, checked to be the same for the whole text, for every split into two
    pieces at each character offset, and for one character at a time."""
    whole_kw = dict(kw)
    whole = parse_output(text, new_call_id=ids(), **whole_kw)
    splits = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    for pieces in splits:
        events, c = run(pieces, **kw)
        assert c == whole, f"split {pieces[0]!r} | ... gave {c}, not {whole}"
        assert_deltas_add_up(events, c)
    return whole


def calls(c: Completion) -> list[tuple[str, str]]:
    return [(t.name, t.arguments) for t in c.tool_calls]


def tool(name: str, **properties: dict[str, Any]) -> Tool:
    return Tool(name=name, parameters={"type": "object", "properties": properties})
