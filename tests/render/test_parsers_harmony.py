"""gpt-oss harmony, parsed from text: analysis is reasoning, `to=functions.NAME` a tool call, final text."""

import pytest
from parser_checks import calls, parse_every_split

ANALYSIS = "<|channel|>analysis<|message|>Need the weather.<|end|>"
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Tokyo"}'
)

CASES = {
    "reasoning_then_call_ended_by_the_stop_token": (
        ANALYSIS + CALL,
        "Need the weather.",
        "",
        [("get_weather", '{"city": "Tokyo"}')],
    ),
    "reasoning_then_final": (
        ANALYSIS + "<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>",
        "Need the weather.",
        "It is sunny.",
        [],
    ),
    "recipient_before_the_channel": (
        "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.ls<|channel|>commentary json<|message|>{}<|call|>",
        "x",
        "",
        [("ls", "{}")],
    ),
    "preamble_then_call": (
        "<|channel|>commentary<|message|>Looking it up.<|end|>" + CALL + "<|call|>",
        None,
        "Looking it up.",
        [("get_weather", '{"city": "Tokyo"}')],
    ),
    "code_for_a_builtin_tool_goes_whole": (
        "<|channel|>analysis<|message|>run<|end|><|start|>assistant<|channel|>analysis to=python<|message|>print(1)",
        "run",
        "",
        [("python", "print(1)")],
    ),
    "text_without_harmony_markup": ("plain answer", None, "plain answer", []),
}


@pytest.mark.parametrize("name", CASES)
def test_harmony_output_is_the_same_split_at_every_offset(name):
    text, reasoning, content, expected = CASES[name]
    c = parse_every_split(text, tool_format="harmony")
    assert (c.reasoning, c.text, calls(c)) == (reasoning, content, expected)


def test_harmony_ignores_think_tags():
    c = parse_every_split(
        "<|channel|>final<|message|><think>x</think>", tool_format="harmony", reasoning_format="think"
    )
    assert (c.reasoning, c.text) == (None, "<think>x</think>")
