"""XML tool calls (Qwen3-Coder, Qwen3.5): parameters typed by the tool's JSON Schema."""

import json

import pytest
from parser_checks import calls, ids, parse_every_split, tool

from polarproxy.conversation import ToolCallDelta
from polarproxy.render.output_parser import OutputParser
from polarproxy.render.parsers.qwen_xml import convert

TOOLS = [
    tool(
        "edit",
        path={"type": "string"},
        line={"type": "integer"},
        scale={"type": "number"},
        force={"type": "boolean"},
        opts={"type": "object"},
        tags={"type": "array"},
        note={"type": ["string", "null"]},
        any={"anyOf": [{"type": "integer"}, {"type": "string"}]},
    )
]


def xml(name, **params):
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


CASES = {
    "strings_kept_raw": (
        xml("edit", path="src/a b.py", note='multi\nline "quoted" \\ text\n'),
        "",
        [("edit", json.dumps({"path": "src/a b.py", "note": 'multi\nline "quoted" \\ text\n'}))],
    ),
    "typed_by_schema": (
        xml("edit", line="42", scale="0.5", force="True", opts='{"a": [1]}', tags='["x", "y"]', any="7"),
        "",
        [
            (
                "edit",
                json.dumps(
                    {
                        "line": 42,
                        "scale": 0.5,
                        "force": True,
                        "opts": {"a": [1]},
                        "tags": ["x", "y"],
                        "any": 7,
                    }
                ),
            )
        ],
    ),
    "values_that_do_not_fit_their_type_stay_strings": (
        xml("edit", line="forty-two", opts="{not json", force="maybe"),
        "",
        [("edit", json.dumps({"line": "forty-two", "opts": "{not json", "force": "maybe"}))],
    ),
    "unknown_tool_and_parameter_are_strings": (
        xml("other", n="5") + "\n" + xml("edit", extra="[1]"),
        "",
        [("other", '{"n": "5"}'), ("edit", '{"extra": "[1]"}')],
    ),
    "text_before_and_no_parameters": (
        "I will run it.\n\n<tool_call>\n<function=ls>\n</function>\n</tool_call>",
        "I will run it.",
        [("ls", "{}")],
    ),
    "a_missing_closing_parameter_tag_ends_at_the_next_tag": (
        "<tool_call>\n<function=edit>\n<parameter=path>\na.py\n<parameter=line>\n3\n</function>\n</tool_call>",
        "",
        [("edit", '{"path": "a.py", "line": 3}')],
    ),
    "a_call_without_function_is_text": (
        "<tool_call>\nnot xml\n</tool_call>",
        "<tool_call>\nnot xml\n</tool_call>",
        [],
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_xml_output_is_the_same_split_at_every_offset(name):
    text, content, expected = CASES[name]
    c = parse_every_split(text, tool_format="qwen-xml", tools=TOOLS)
    assert c.text == content
    assert calls(c) == expected
    for t in c.tool_calls:
        json.loads(t.arguments)


def test_a_string_parameter_streams_as_it_is_sampled():
    parser = OutputParser(new_call_id=ids(), tool_format="qwen-xml", tools=TOOLS)
    events = parser.feed("<tool_call>\n<function=edit>\n<parameter=path>\nsrc/ma")
    args = "".join(e.arguments for e in events if isinstance(e, ToolCallDelta))
    assert args == '{"path": "src/ma'


def test_a_call_cut_short_still_has_json_arguments():
    c = parse_every_split(
        "<tool_call>\n<function=edit>\n<parameter=path>\nsrc/ma",
        tool_format="qwen-xml",
        tools=TOOLS,
        finish_reason="length",
    )
    assert calls(c) == [("edit", '{"path": "src/ma"}')]


def test_reasoning_then_an_xml_call():
    c = parse_every_split(
        "<think>\nhm\n</think>\n\n" + xml("edit", line="1"), tool_format="qwen-xml", tools=TOOLS
    )
    assert (c.reasoning, calls(c)) == ("hm", [("edit", '{"line": 1}')])


@pytest.mark.parametrize(
    ("text", "schema", "value"),
    [
        ("12", {"type": "integer"}, 12),
        (" -3 ", {"type": "number"}, -3),
        ("1e3", {"type": "number"}, 1000.0),
        ("nan", {"type": "number"}, "nan"),
        ("false", {"type": "boolean"}, False),
        ("null", {"type": ["integer", "null"]}, None),
        ("007", {"type": "string"}, "007"),
        ("[1]", {"type": "object"}, "[1]"),
        ('{"a": 1}', {}, {"a": 1}),
        ("plain words", {}, "plain words"),
        ("5", None, "5"),
    ],
)
def test_parameter_values_are_typed_by_their_schema(text, schema, value):
    assert convert(text, schema) == value
