"""Mistral `[TOOL_CALLS] [...]` tool calls (the form of ../shared/fixtures/chat-templates/mistral-parallel-tools.jinja)."""

import pytest
from parser_checks import calls, parse_every_split

CASES = {
    "parallel_calls": (
        '[TOOL_CALLS] [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": "]"}}]',
        "",
        [("a", '{"x": 1}'), ("b", '{"y": "]"}')],
    ),
    "the_templates_id_and_string_arguments": (
        '[TOOL_CALLS] [{"name": "a", "arguments": "{\\"x\\": 1}", "id": "abcdef123"}]',
        "",
        [("a", '{"x": 1}')],
    ),
    "id_after_object_arguments": (
        '[TOOL_CALLS] [{"name": "a", "arguments": {"x": {}}, "id": "abcdef123"}]',
        "",
        [("a", '{"x": {}}')],
    ),
    "newer_name_args_form": (
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Nice"}',
        "",
        [("get_weather", '{"city": "Nice"}')],
    ),
    "text_before": ('Sure. [TOOL_CALLS] [{"name": "a", "arguments": {}}]', "Sure.", [("a", "{}")]),
    "not_an_array_is_text": ("[TOOL_CALLS] oops", "[TOOL_CALLS] oops", []),
    "an_object_that_is_no_call_is_text": (
        '[TOOL_CALLS] [{"tool": "a"}]',
        '[TOOL_CALLS] [{"tool": "a"}]',
        [],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_mistral_output_is_the_same_split_at_every_offset(name):
    text, content, expected = CASES[name]
    c = parse_every_split(text, tool_format="mistral", reasoning_format="none")
    assert c.text == content
    assert calls(c) == expected
