import itertools

import pytest

from polarproxy.conversation import ReasoningDelta, TextDelta, ToolCallEvent
from polarproxy.render.output_parser import OutputParser, parse_output


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


CASES = {
    "plain": ("Hello there.", None, "Hello there.", []),
    "reasoning_then_text": (
        "<think>\nLet me see.\n</think>\n\nThe answer is 4.",
        "Let me see.",
        "The answer is 4.",
        [],
    ),
    "tool_call": (
        '<tool_call>\n{"name": "list_files", "arguments": {"path": "."}}\n</tool_call>',
        None,
        "",
        [("list_files", '{"path": "."}')],
    ),
    "text_and_two_calls": (
        'Checking.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n'
        '{"name": "b", "arguments": "{\\"k\\": 1}"}\n</tool_call>',
        None,
        "Checking.",
        [("a", "{}"), ("b", '{"k": 1}')],
    ),
    "broken_call_is_text": (
        "<tool_call>\n{not json}\n</tool_call>",
        None,
        "<tool_call>\n{not json}\n</tool_call>",
        [],
    ),
    "unclosed_call_is_text": ('<tool_call>\n{"name": "a"', None, '<tool_call>\n{"name": "a"', []),
    "unclosed_think_is_reasoning": ("<think>\nstill thinking", "still thinking", "", []),
    "almost_a_tag": ("a < b and <thin ice>", None, "a < b and <thin ice>", []),
    "empty_reasoning": ("<think>\n\n</think>\n\nDone.", "", "Done.", []),
}


def collect(pieces):
    parser = OutputParser(new_call_id=ids())
    events = []
    for p in pieces:
        events += parser.feed(p)
    tail, completion = parser.finish("stop")
    return events + tail, completion


@pytest.mark.parametrize("name", CASES)
def test_parse_whole_text(name):
    text, reasoning, content, calls = CASES[name]
    c = parse_output(text, new_call_id=ids())
    assert c.reasoning == reasoning
    assert c.text == content
    assert [(t.name, t.arguments) for t in c.tool_calls] == calls
    assert c.finish_reason == ("tool_calls" if calls else "stop")


@pytest.mark.parametrize("name", CASES)
def test_streamed_deltas_add_up_to_the_whole_parse_at_every_split(name):
    text = CASES[name][0]
    whole = parse_output(text, new_call_id=ids())
    for size in (1, 2, 3, 7):
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        events, c = collect(pieces)
        assert c == whole
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == whole.text
        streamed_reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
        assert streamed_reasoning == (whole.reasoning or "")
        assert [e.call for e in events if isinstance(e, ToolCallEvent)] == whole.tool_calls


def test_text_is_not_streamed_past_a_partial_tag():
    parser = OutputParser(new_call_id=ids())
    assert parser.feed("Look <tool") == [TextDelta("Look")]
    events = parser.feed('_call>\n{"name": "x", "arguments": {}}\n</tool_call>')
    assert [type(e) for e in events] == [ToolCallEvent]


def test_length_finish_is_kept_even_with_a_tool_call():
    c = parse_output(
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>', new_call_id=ids(), finish_reason="length"
    )
    assert c.finish_reason == "length"
