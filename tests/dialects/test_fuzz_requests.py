"""Hostile request bodies in all four wire formats (property-based, hypothesis): whatever a harness sends,
the dialect either returns a well-typed Conversation (every field of its declared type, every integer in
64 bits, encodable as JSON for the store and the backend) or refuses with a DialectError that becomes a 4xx
in the format's own error shape; a field of the wrong type is always refused, and a valid body always parses.
The same bodies end to end through the real proxy: tests/capture/test_hostile_requests_e2e.py."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polarproxy.conversation import Conversation, Message
from polarproxy.dialects import route
from polarproxy.dialects.base import DialectError

INT64 = 2**63
PATHS = {
    "openai_chat": "/v1/chat/completions",
    "openai_responses": "/v1/responses",
    "anthropic": "/v1/messages",
    "gemini": "/v1beta/models/m:generateContent",
}
TOOL = {"type": "object", "properties": {"path": {"type": "string"}}}

# One valid body per format, touching every field the dialect reads.
VALID: dict[str, dict[str, Any]] = {
    "openai_chat": {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "Look first.",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
        ],
        "tools": [
            {"type": "function", "function": {"name": "ls", "description": "List", "parameters": TOOL}}
        ],
        "max_tokens": 8,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 5,
        "seed": 3,
        "stop": ["\n\n"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tool_choice": "auto",
    },
    "openai_responses": {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "List the files."}],
            },
            {
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": "Look."}],
                "encrypted_content": "e",
            },
            {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.py"},
        ],
        "tools": [{"type": "function", "name": "ls", "description": "List", "parameters": TOOL}],
        "max_output_tokens": 8,
        "temperature": 0.5,
        "top_p": 0.9,
        "stream": True,
        "tool_choice": "auto",
        "reasoning": {"effort": "low"},
        "store": False,
    },
    "anthropic": {
        "model": "m",
        "max_tokens": 8,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": "List the files."},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Look.", "signature": "s"},
                    {"type": "tool_use", "id": "c1", "name": "ls", "input": {}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "a.py"}]},
        ],
        "tools": [{"name": "ls", "description": "List", "input_schema": TOOL}],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 5,
        "stop_sequences": ["\n\n"],
        "stream": True,
        "tool_choice": {"type": "auto"},
    },
    "gemini": {
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "contents": [
            {"role": "user", "parts": [{"text": "List the files."}]},
            {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "ls", "response": {"output": "a.py"}}}]},
        ],
        "tools": [{"functionDeclarations": [{"name": "ls", "description": "List", "parameters": TOOL}]}],
        "generationConfig": {
            "maxOutputTokens": 8,
            "temperature": 0.5,
            "topP": 0.9,
            "topK": 5,
            "seed": 3,
            "stopSequences": ["\n\n"],
        },
        "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
    },
}

# Fields that must hold one JSON type (or be absent/null): any other value is refused.
NUMBERS = {
    "openai_chat": [
        ("max_tokens",),
        ("max_completion_tokens",),
        ("temperature",),
        ("top_p",),
        ("top_k",),
        ("seed",),
    ],
    "openai_responses": [("max_output_tokens",), ("temperature",), ("top_p",)],
    "anthropic": [("max_tokens",), ("temperature",), ("top_p",), ("top_k",)],
    "gemini": [("generationConfig", k) for k in ("maxOutputTokens", "temperature", "topP", "topK", "seed")],
}
STRINGS = {
    "openai_chat": [("model",), ("messages", 1, "content", 0, "text"), ("messages", 3, "tool_call_id")],
    "openai_responses": [("model",), ("input", 0, "content", 0, "text"), ("tools", 0, "description")],
    "anthropic": [("model",), ("messages", 0, "content"), ("tools", 0, "description")],
    "gemini": [("contents", 0, "parts", 0, "text"), ("tools", 0, "functionDeclarations", 0, "description")],
}
FLAGS = {
    "openai_chat": [("stream",)],
    "openai_responses": [("stream",)],
    "anthropic": [("stream",)],
    "gemini": [],
}
REQUIRED = {  # removing one of these is refused
    "openai_chat": [("messages",), ("messages", 1, "content"), ("messages", 3, "tool_call_id")],
    "openai_responses": [("input",)],
    "anthropic": [("messages",), ("max_tokens",)],
    "gemini": [("contents",)],
}

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
huge_ints = st.integers(min_value=INT64, max_value=2**200) | st.integers(
    min_value=-(2**200), max_value=-INT64 - 1
)
not_numbers = st.one_of(st.booleans(), st.text(max_size=8), st.lists(json_scalars, max_size=2), huge_ints)
not_strings = st.one_of(
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(json_scalars, min_size=1, max_size=2),
)
not_flags = st.one_of(st.integers(), st.text(max_size=8), st.lists(json_scalars, min_size=1, max_size=2))


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path to a value inside a body."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


ALL_PATHS = {name: _paths(body) for name, body in VALID.items()}
DELETE = object()


def _with(body: dict[str, Any], path: tuple, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    node = out
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


def _wire(body: Any) -> Any:
    """The body as the proxy sees it: sent as JSON text, read by orjson (which reads integers beyond 64 bits
    as floats)."""
    return orjson.loads(json.dumps(body))


def _parse(dialect: str, body: Any) -> Conversation:
    d = route("POST", PATHS[dialect])
    assert d is not None and d.name == dialect
    return d.parse(_wire(body), path=PATHS[dialect], query={})


def _check_refusal(dialect: str, e: DialectError) -> None:
    """A refusal is a 4xx in the format's own error shape, naming what is wrong."""
    assert 400 <= e.status < 500 and isinstance(e.message, str) and e.message
    d = route("POST", PATHS[dialect])
    assert d is not None
    body = orjson.loads(d.error(e.status, e.message, e.code))
    if dialect == "anthropic":
        assert body["type"] == "error" and body["error"]["message"] == e.message
    elif dialect == "gemini":
        assert body["error"]["code"] == e.status and body["error"]["message"] == e.message
    else:
        assert body["error"]["message"] == e.message and isinstance(body["error"]["type"], str)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -INT64 <= v < INT64


def _check_message(m: Message) -> None:
    assert m.role in ("system", "user", "assistant", "tool")
    assert isinstance(m.content, str)
    for v in (m.reasoning, m.tool_call_id, m.name, m.signature):
        assert v is None or isinstance(v, str)
    for t in m.tool_calls:
        assert isinstance(t.id, str) and isinstance(t.name, str) and isinstance(t.arguments, str)


def _check_conversation(conv: Conversation) -> None:
    """Every field of its declared type; what the store and the backend encode, encodable."""
    assert (
        isinstance(conv.model, str) and isinstance(conv.stream, bool) and isinstance(conv.include_usage, bool)
    )
    assert conv.messages
    for m in conv.messages:
        _check_message(m)
    for t in conv.tools:
        assert isinstance(t.name, str) and isinstance(t.description, str) and isinstance(t.parameters, dict)
    s = conv.sampling
    assert s.max_tokens is None or (_is_int(s.max_tokens) and s.max_tokens >= 1)
    for v in (s.top_k, s.seed):
        assert v is None or _is_int(v)
    for v in (s.temperature, s.top_p):
        assert v is None or (isinstance(v, float) and math.isfinite(v))
    assert all(isinstance(x, str) for x in s.stop)
    assert conv.tool_choice is None or isinstance(conv.tool_choice, str | dict)
    orjson.dumps(conv.to_dict())


def _parse_or_refuse(dialect: str, body: Any) -> Conversation | None:
    try:
        conv = _parse(dialect, body)
    except DialectError as e:
        _check_refusal(dialect, e)
        return None
    _check_conversation(conv)
    return conv


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("dialect", VALID)
def test_the_valid_body_of_each_format_parses(dialect):
    conv = _parse(dialect, VALID[dialect])
    _check_conversation(conv)
    assert [m.role for m in conv.messages][:2] in (["system", "user"],)


@pytest.mark.parametrize("dialect", VALID)
@FUZZ
@given(data=st.data())
def test_any_value_anywhere_parses_well_typed_or_is_refused_in_the_formats_shape(dialect, data):
    path = data.draw(st.sampled_from(ALL_PATHS[dialect]), label="path")
    value = data.draw(st.one_of(st.just(DELETE), json_values), label="value")
    _parse_or_refuse(dialect, _with(VALID[dialect], path, value))


@pytest.mark.parametrize("dialect", VALID)
@FUZZ
@given(body=json_values)
def test_any_json_body_parses_well_typed_or_is_refused(dialect, body):
    _parse_or_refuse(dialect, body)


@pytest.mark.parametrize("dialect", VALID)
@FUZZ
@given(data=st.data())
def test_a_field_of_the_wrong_type_is_refused(dialect, data):
    kind = data.draw(st.sampled_from(["number", "string", "flag", "required"]), label="kind")
    fields = {"number": NUMBERS, "string": STRINGS, "flag": FLAGS, "required": REQUIRED}[kind][dialect]
    if not fields:
        return
    path = data.draw(st.sampled_from(fields), label="path")
    bad = {"number": not_numbers, "string": not_strings, "flag": not_flags, "required": st.just(DELETE)}[kind]
    value = data.draw(bad, label="value")
    with pytest.raises(DialectError) as e:
        _parse(dialect, _with(VALID[dialect], path, value))
    _check_refusal(dialect, e.value)


@pytest.mark.parametrize("dialect", VALID)
@FUZZ
@given(data=st.data())
def test_valid_values_in_every_field_parse(dialect, data):
    body = VALID[dialect]
    for path in NUMBERS[dialect]:
        key = path[-1]
        if key in ("max_tokens", "max_completion_tokens", "max_output_tokens", "maxOutputTokens"):
            v: Any = data.draw(st.integers(1, 2**31 - 1))
        elif key in ("top_p", "topP"):
            v = data.draw(st.floats(0, 1))
        elif key in ("temperature",):
            v = data.draw(st.floats(0, 2))
        elif key in ("top_k", "topK"):
            v = data.draw(st.integers(-1, 1000))
        else:
            v = data.draw(st.integers(-INT64, INT64 - 1))
        body = _with(body, path, v)
    for path in STRINGS[dialect]:
        body = _with(body, path, data.draw(st.text(min_size=1, max_size=20)))
    for path in FLAGS[dialect]:
        body = _with(body, path, data.draw(st.booleans()))
    _check_conversation(_parse(dialect, body))


@pytest.mark.parametrize(
    ("dialect", "body", "says"),
    [
        ("openai_chat", {**VALID["openai_chat"], "max_tokens": 10**30}, "max_tokens"),
        ("openai_chat", {"model": 5, "messages": [{"role": "user", "content": "hi"}]}, "model"),
        ("openai_chat", {"model": "m", "messages": [{"role": "user"}]}, "messages[0].content"),
        ("openai_responses", {**VALID["openai_responses"], "max_output_tokens": 2**64}, "max_output_tokens"),
        ("anthropic", {**VALID["anthropic"], "max_tokens": 2**64}, "max_tokens"),
        ("gemini", _with(VALID["gemini"], ("generationConfig", "maxOutputTokens"), 2**64), "maxOutputTokens"),
    ],
)
def test_the_reported_bodies_are_refused_naming_the_field(dialect, body, says):
    with pytest.raises(DialectError) as e:
        _parse(dialect, body)
    assert says in e.value.message
    _check_refusal(dialect, e.value)
