# ruff: noqa: RUF001  (DeepSeek spells its special tokens with U+FF5C FULLWIDTH VERTICAL LINE)
"""DeepSeek-V3 special-token tool calls (the form of ../shared/fixtures/chat-templates/deepseek-v3-tools.jinja)."""

import json

import pytest
from parser_checks import calls, parse_every_split

B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, CE, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def call(name, args):
    return f"{CB}function{SEP}{name}\n```json\n{args}\n```{CE}"


CASES = {
    "one_call": (B + call("ls", '{"path": "."}') + E, "", [("ls", '{"path": "."}')]),
    "text_then_two_calls": (
        "Checking." + B + call("a", '{"k": [1, "```"]}') + "\n" + call("b", "{}") + E,
        "Checking.",
        [("a", '{"k": [1, "```"]}'), ("b", "{}")],
    ),
    # the vLLM template writes the arguments string with `tojson`: a JSON string holding the object
    "arguments_as_a_json_string": (
        B + call("a", json.dumps('{"k": 1}')) + E,
        "",
        [("a", '{"k": 1}')],
    ),
    "v3_1_form": (B + f"{CB}ls{SEP}" + '{"path": "/"}' + CE + E, "", [("ls", '{"path": "/"}')]),
    "broken_header_is_text": (B + CB + "nonsense" + CE + E, B + CB + "nonsense" + CE + E, []),
    "plain": ("Just text.", "Just text.", []),
}


@pytest.mark.parametrize("name", CASES)
def test_deepseek_output_is_the_same_split_at_every_offset(name):
    text, content, expected = CASES[name]
    c = parse_every_split(text, tool_format="deepseek", reasoning_format="none")
    assert c.text == content
    assert calls(c) == expected
