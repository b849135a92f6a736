"""Llama 3.1 JSON tool calls: `{"name": ..., "parameters": {...}}`, optionally after <|python_tag|>."""

import pytest
from parser_checks import calls, parse_every_split

CASES = {
    "bare_call": (
        '{"name": "weather", "parameters": {"city": "Paris"}}',
        "",
        [("weather", '{"city": "Paris"}')],
    ),
    "after_python_tag": (
        '<|python_tag|>{"name": "weather", "parameters": {"city": "Oslo", "days": [1, 2]}}',
        "",
        [("weather", '{"city": "Oslo", "days": [1, 2]}')],
    ),
    "two_calls_separated_by_semicolons": (
        '{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"x": "}{"}}',
        "",
        [("a", "{}"), ("b", '{"x": "}{"}')],
    ),
    "keys_in_another_order": ('{"parameters": {"k": 1}, "name": "a"}', "", [("a", '{"k": 1}')]),
    "end_of_turn_token_after_the_call": (
        '{"name": "a", "parameters": {"k": true}}<|eot_id|>',
        "",
        [("a", '{"k": true}')],
    ),
    "plain_answer": ("The weather is {fine}.", "The weather is {fine}.", []),
    "json_that_is_no_call_is_text": ('{"answer": 4}', '{"answer": 4}', []),
    "builtin_tool_code_is_text": (
        '<|python_tag|>brave_search.call(query="x")',
        '<|python_tag|>brave_search.call(query="x")',
        [],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_llama_output_is_the_same_split_at_every_offset(name):
    text, content, expected = CASES[name]
    c = parse_every_split(text, tool_format="llama-json", reasoning_format="none")
    assert c.text == content
    assert calls(c) == expected
    assert c.finish_reason == ("tool_calls" if expected else "stop")
