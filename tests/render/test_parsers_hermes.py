"""Hermes JSON tool calls (Qwen2.5, Qwen3, Hermes, the tiny model)."""

import pytest
from parser_checks import calls, ids, parse_every_split

from polarproxy.conversation import TextDelta, ToolCallDelta, ToolCallEvent
from polarproxy.render.output_parser import OutputParser

CASES = {
    "one_call": (
        '<tool_call>\n{"name": "read", "arguments": {"path": "a.txt", "n": [1, {"x": "}"}]}}\n</tool_call>',
        "",
        [("read", '{"path": "a.txt", "n": [1, {"x": "}"}]}')],
    ),
    "text_then_two_calls": (
        'Let me look.\n\n<tool_call>\n{"name": "a", "arguments": {"q": "say \\"hi\\" <b>"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>',
        "Let me look.",
        [("a", '{"q": "say \\"hi\\" <b>"}'), ("b", "{}")],
    ),
    "reasoning_and_call": (
        '<think>\nplan\n</think>\n\n<tool_call>\n{"name": "a", "arguments": {"k": 1}}\n</tool_call>',
        "",
        [("a", '{"k": 1}')],
    ),
    "keys_in_other_order_parse_whole": (
        '<tool_call>\n{"arguments": {"k": 1}, "name": "a"}\n</tool_call>',
        "",
        [("a", '{"k": 1}')],
    ),
    "arguments_as_a_string": (
        '<tool_call>\n{"name": "a", "arguments": "{\\"k\\": 1}"}\n</tool_call>',
        "",
        [("a", '{"k": 1}')],
    ),
    "non_json_call_is_text": (
        "<tool_call>\n{name: a}\n</tool_call> then",
        "<tool_call>\n{name: a}\n</tool_call> then",
        [],
    ),
    "name_missing_is_text": (
        '<tool_call>\n{"arguments": {}}\n</tool_call>',
        '<tool_call>\n{"arguments": {}}\n</tool_call>',
        [],
    ),
    "unicode_arguments": (
        '<tool_call>\n{"name": "écrire", "arguments": {"t": "日本語 🙂"}}\n</tool_call>',
        "",
        [("écrire", '{"t": "日本語 🙂"}')],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_hermes_output_is_the_same_split_at_every_offset(name):
    text, content, expected = CASES[name]
    c = parse_every_split(text, tool_format="hermes")
    assert c.text == content
    assert calls(c) == expected


def test_arguments_stream_before_the_call_closes():
    parser = OutputParser(new_call_id=ids())
    events = parser.feed('<tool_call>\n{"name": "write", "arguments": {"text": "hello wor')
    assert events == [
        ToolCallDelta(0, "call_0", "write", ""),
        ToolCallDelta(0, "call_0", "write", '{"text": "hello wor'),
    ]
    events = parser.feed('ld"}}\n</tool_call>')
    assert events[0] == ToolCallDelta(0, "call_0", "write", 'ld"}')
    assert isinstance(events[-1], ToolCallEvent) and events[-1].call.arguments == '{"text": "hello world"}'


def test_a_call_cut_by_the_token_limit_keeps_the_arguments_sampled():
    c = parse_every_split(
        '<tool_call>\n{"name": "write", "arguments": {"text": "hel',
        tool_format="hermes",
        finish_reason="length",
    )
    assert calls(c) == [("write", '{"text": "hel')]
    assert c.finish_reason == "length"


def test_text_after_a_call_is_text():
    c = parse_every_split(
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\nDone.', tool_format="hermes"
    )
    assert (c.text, calls(c)) == ("Done.", [("a", "{}")])


def test_a_closing_tag_inside_the_arguments_ends_them():
    c = parse_every_split(
        '<tool_call>\n{"name": "a", "arguments": {"k": </tool_call>ok', tool_format="hermes"
    )
    assert calls(c) == [("a", '{"k": ')]
    assert c.text == "ok"


def test_reasoning_none_keeps_think_tags_as_text():
    c = parse_every_split("<think>x</think>y", tool_format="hermes", reasoning_format="none")
    assert (c.reasoning, c.text) == (None, "<think>x</think>y")


def test_a_prompt_that_opened_think_starts_the_answer_in_reasoning():
    c = parse_every_split("plan\n</think>\n\nanswer", tool_format="hermes", reasoning_open=True)
    assert (c.reasoning, c.text) == ("plan", "answer")


def test_text_deltas_never_include_a_partial_tag():
    parser = OutputParser(new_call_id=ids())
    assert parser.feed("Look <tool") == [TextDelta("Look")]
