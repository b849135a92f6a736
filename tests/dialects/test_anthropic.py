import json

import orjson
import pytest

from polarproxy.conversation import Completion, ReasoningDelta, TextDelta, ToolCall, ToolCallEvent, Usage
from polarproxy.dialects import DialectError, route
from polarproxy.dialects.anthropic import RAW_ARGUMENTS_KEY, AnthropicMessages
from polarproxy.dialects.base import answer_signature
from polarproxy.sse import SSEDecoder

ANTH = AnthropicMessages()
HARNESSES = ["claude", "claude-authtoken", "pi-anth"]


def body(**kw):
    return {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **kw}


def test_routes():
    for path in ("/v1/messages", "/anthropic/v1/messages", "/v1/messages/"):
        assert isinstance(route("POST", path), AnthropicMessages)
    assert route("GET", "/v1/messages") is None
    assert not ANTH.matches("POST", "/v1/messages/count_tokens")
    assert not ANTH.matches("POST", "/v1/chat/completions")


@pytest.mark.parametrize("harness", HARNESSES)
def test_every_captured_request_parses(traffic, harness):
    for rec in traffic(harness):
        raw = rec["body"]
        assert isinstance(route(rec["method"], rec["path"]), AnthropicMessages)
        conv = ANTH.parse(raw, path=rec["path"], query=rec["query"])
        assert conv.stream == bool(raw.get("stream"))
        assert conv.model == raw["model"]
        assert conv.sampling.max_tokens == raw["max_tokens"]
        assert len(conv.tools) == len(raw["tools"])
        assert [t.name for t in conv.tools] == [t["name"] for t in raw["tools"]]
        assert all(t.parameters == r["input_schema"] for t, r in zip(conv.tools, raw["tools"], strict=True))
        assert conv.messages[0].role == "system"
        assert conv.messages[0].content == "\n".join(b["text"] for b in raw["system"])
        # tool_use / tool_result pairing: every tool message answers a call made before it
        seen: set[str] = set()
        for m in conv.messages:
            seen.update(c.id for c in m.tool_calls)
            if m.role == "tool":
                assert m.tool_call_id in seen
        json.dumps(conv.to_dict())  # plain data


def test_claude_code_system_blocks_and_in_messages_system(traffic):
    raw = traffic("claude")[2]["body"]
    conv = ANTH.parse(raw)
    system = conv.messages[0]
    assert system.content.startswith("x-anthropic-billing-header: cc_version=")
    assert "\nYou are a Claude agent, built on Anthropic's Claude Agent SDK.\n" in system.content
    assert [m.role for m in conv.messages] == ["system", "user", "system", "assistant", "tool"]
    user = conv.messages[1]
    assert user.content == "".join(b["text"] for b in raw["messages"][0]["content"])
    assert conv.messages[2].content == raw["messages"][1]["content"]
    assert conv.messages[2].content.startswith("Available agent types")
    assert len(conv.tools) == 25


def test_claude_code_thinking_signature_and_tool_round_trip(traffic):
    conv = ANTH.parse(traffic("claude")[2]["body"])
    assistant, tool = conv.messages[3], conv.messages[4]
    assert assistant.reasoning == "Thinking about the request."
    assert assistant.signature == "FAKE_SIGNATURE_msg_000002"
    assert assistant.content == ""
    assert assistant.tool_calls == [ToolCall(id="toolu_000003", name="Bash", arguments='{"command": "ls"}')]
    assert tool.role == "tool" and tool.tool_call_id == "toolu_000003"
    assert tool.content == "README.md\nhello.py"  # cache_control and is_error: false change nothing


def test_pi_anthropic(traffic):
    first, second = (r["body"] for r in traffic("pi-anth"))
    conv = ANTH.parse(first)
    assert [m.role for m in conv.messages] == ["system", "user"]
    assert len(conv.tools) == 4
    conv = ANTH.parse(second)
    assert [m.role for m in conv.messages] == ["system", "user", "assistant", "tool"]
    assert conv.messages[2].signature == "FAKE_SIGNATURE_msg_000001"
    assert conv.messages[3].content == "README.md\nhello.py\n"
    assert conv.sampling.max_tokens == 8192


def test_tool_results_then_text_and_errors():
    conv = ANTH.parse(
        body(
            messages=[
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Two calls."},
                        {"type": "tool_use", "id": "a", "name": "ls", "input": {"p": "é"}},
                        {"type": "tool_use", "id": "b", "name": "ls", "input": {}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "a",
                            "content": [{"type": "text", "text": "x"}],
                        },
                        {"type": "tool_result", "tool_use_id": "b", "content": "no such", "is_error": True},
                        {"type": "text", "text": "and now?", "cache_control": {"type": "ephemeral"}},
                    ],
                },
            ],
            system="Be brief.",
        )
    )
    assert [(m.role, m.content) for m in conv.messages] == [
        ("system", "Be brief."),
        ("user", "go"),
        ("assistant", "Two calls."),
        ("tool", "x"),
        ("tool", "Error: no such"),
        ("user", "and now?"),
    ]
    assert conv.messages[2].tool_calls[0].arguments == '{"p": "é"}'
    assert [m.tool_call_id for m in conv.messages[3:5]] == ["a", "b"]


def test_redacted_thinking_keeps_its_data_as_signature():
    conv = ANTH.parse(
        body(
            messages=[
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "redacted_thinking", "data": "opaque"},
                        {"type": "text", "text": "a"},
                    ],
                },
            ]
        )
    )
    assert conv.messages[1].signature == "opaque" and conv.messages[1].reasoning is None


def test_sampling_tool_choice_and_server_tools():
    conv = ANTH.parse(
        body(
            temperature=0,
            top_p=0.5,
            top_k=20,
            stop_sequences=["END"],
            stream=True,
            metadata={"user_id": "u"},
            thinking={"type": "enabled", "budget_tokens": 1024},
            tool_choice={"type": "tool", "name": "ls"},
            tools=[
                {"name": "ls", "description": "list", "input_schema": {"type": "object"}},
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
                {"type": "custom", "name": "cat", "input_schema": {"type": "object"}},
            ],
        )
    )
    s = conv.sampling
    assert (s.temperature, s.top_p, s.top_k, s.stop, s.max_tokens) == (0.0, 0.5, 20, ["END"], 64)
    assert conv.stream
    assert [t.name for t in conv.tools] == ["ls", "cat"]
    assert conv.tool_choice == {"type": "function", "function": {"name": "ls"}}
    for choice, neutral in (("auto", "auto"), ("any", "required"), ("none", "none")):
        assert ANTH.parse(body(tool_choice={"type": choice})).tool_choice == neutral
    for thinking in ({"type": "adaptive"}, {"type": "disabled"}):
        ANTH.parse(body(thinking=thinking))


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ([], "JSON object"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens is required"),
        (body(max_tokens="many"), "max_tokens must be an integer, not 'many'"),
        (body(max_tokens=0), "positive integer, not 0"),
        (body(messages=[]), "non-empty"),
        (body(messages=[{"role": "wizard", "content": "x"}]), "Unknown role 'wizard'"),
        (
            body(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
            "'image' at messages[0].content[0] is not supported: this model takes text only",
        ),
        (
            body(messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}]),
            "'document' at messages[0].content[0]",
        ),
        (
            body(messages=[{"role": "user", "content": [{"type": "video"}]}]),
            "Unsupported content block type 'video' at messages[0].content[0]. Supported: 'text', 'tool_result'",
        ),
        (
            body(messages=[{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]),
            "Supported: 'text', 'thinking', 'redacted_thinking', 'tool_use'",
        ),
        (body(tool_choice={"type": "sometimes"}), "tool_choice.type 'sometimes'"),
        (body(tool_choice={"type": "tool"}), "needs a string name"),
        (body(temperature="hot"), "temperature must be a number, not 'hot'"),
        (body(stop_sequences="END"), "stop_sequences must be an array of strings"),
        (body(system=[{"type": "image"}]), "'image' at system[0]"),
        (body(tools=[{"description": "no name"}]), "tools[0] needs a string name"),
        (body(thinking=True), "thinking must be an object"),
        (
            body(messages=[{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]),
            "needs a string tool_use_id",
        ),
    ],
)
def test_bad_requests_name_the_bad_value(raw, fragment):
    with pytest.raises(DialectError) as e:
        ANTH.parse(raw)
    assert fragment in e.value.message
    assert e.value.status == 400


def completion(**kw):
    base = dict(
        text="Done.",
        reasoning="thought",
        tool_calls=[ToolCall(id="call_1", name="ls", arguments='{"path": "."}')],
        finish_reason="tool_calls",
        usage=Usage(prompt_tokens=10, completion_tokens=5),
        signature=answer_signature("1"),
    )
    return Completion(**{**base, **kw})


def test_non_streamed_response_validates_as_an_sdk_message():
    from anthropic.types import Message

    msg = Message.model_validate(
        orjson.loads(ANTH.response(completion(), response_id="1", model="m", created=1))
    )
    assert msg.id == "msg_1" and msg.role == "assistant"
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use"]
    assert msg.content[0].thinking == "thought" and msg.content[0].signature == "polarproxy:1"
    assert msg.content[1].text == "Done."
    assert msg.content[2].input == {"path": "."} and msg.content[2].id == "call_1"
    assert msg.stop_reason == "tool_use" and msg.stop_sequence is None
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (10, 5)


@pytest.mark.parametrize(
    "c, reason",
    [
        (completion(tool_calls=[], finish_reason="stop"), "end_turn"),
        (completion(tool_calls=[], finish_reason="length"), "max_tokens"),
        (completion(tool_calls=[], finish_reason="abort"), "end_turn"),
    ],
)
def test_stop_reasons(c, reason):
    assert orjson.loads(ANTH.response(c, response_id="1", model="m", created=1))["stop_reason"] == reason


def test_arguments_that_are_not_a_json_object_round_trip_under_a_key():
    c = completion(reasoning=None, text="", tool_calls=[ToolCall(id="c", name="ls", arguments="not json")])
    out = orjson.loads(ANTH.response(c, response_id="1", model="m", created=1))
    assert out["content"] == [
        {"type": "tool_use", "id": "c", "name": "ls", "input": {RAW_ARGUMENTS_KEY: "not json"}}
    ]
    back = ANTH.parse(
        body(messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": out["content"]}])
    )
    assert back.messages[1].tool_calls[0].arguments == "not json"


def stream_bytes(c: Completion, deltas) -> bytes:
    w = ANTH.stream_writer(
        ANTH.parse(body(stream=True)), response_id="1", model="m", created=1, prompt_tokens=10
    )
    assert w.content_type == "text/event-stream"
    return w.start() + w.events(deltas) + w.keepalive() + w.finish(c)


DELTAS = [
    ReasoningDelta("thou"),
    ReasoningDelta("ght"),
    TextDelta("Do"),
    TextDelta("ne."),
    ToolCallEvent(0, ToolCall(id="call_1", name="ls", arguments='{"path": "."}')),
    ToolCallEvent(1, ToolCall(id="call_2", name="cat", arguments='{"f": "a"}')),
]


def test_stream_is_accumulated_by_the_anthropic_sdk():
    from anthropic.lib.streaming._messages import accumulate_event
    from anthropic.types import RawMessageStreamEvent
    from pydantic import TypeAdapter

    c = completion(
        tool_calls=[e.call for e in DELTAS if isinstance(e, ToolCallEvent)],
    )
    events = SSEDecoder().decode(stream_bytes(c, DELTAS))
    names = [e.event for e in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert "ping" in names
    adapter = TypeAdapter(RawMessageStreamEvent)
    snapshot, bufs = None, {}
    for ev in events:
        data = json.loads(ev.data)
        assert data["type"] == ev.event
        if ev.event == "ping":
            continue
        snapshot = accumulate_event(
            event=adapter.validate_python(data), current_snapshot=snapshot, json_bufs=bufs
        )
    assert snapshot is not None
    assert [b.type for b in snapshot.content] == ["thinking", "text", "tool_use", "tool_use"]
    assert snapshot.content[0].thinking == "thought"
    assert snapshot.content[0].signature == c.signature == "polarproxy:1"
    assert snapshot.content[1].text == "Done."
    assert snapshot.content[2].input == {"path": "."} and snapshot.content[3].input == {"f": "a"}
    assert snapshot.stop_reason == "tool_use"
    assert (snapshot.usage.input_tokens, snapshot.usage.output_tokens) == (10, 5)
    # the same content as the non-streamed answer
    whole = orjson.loads(ANTH.response(c, response_id="1", model="m", created=1))
    assert snapshot.to_dict()["content"] == whole["content"]


def test_blocks_open_and_close_in_order():
    c = completion(tool_calls=[DELTAS[4].call])
    raw = stream_bytes(
        c, [ReasoningDelta("a"), TextDelta("b"), ReasoningDelta("c"), DELTAS[4], TextDelta("d")]
    )
    open_: int | None = None
    expected = 0
    for ev in SSEDecoder().decode(raw):
        data = json.loads(ev.data)
        if ev.event == "content_block_start":
            assert open_ is None and data["index"] == expected
            open_ = data["index"]
        elif ev.event in ("content_block_delta", "content_block_stop"):
            assert data["index"] == open_
            if ev.event == "content_block_stop":
                open_, expected = None, expected + 1
        elif ev.event in ("message_delta", "message_stop"):
            assert open_ is None
    assert expected == 5


def test_finish_closes_an_open_block_and_text_only_streams_have_no_thinking():
    c = completion(reasoning=None, tool_calls=[], finish_reason="length")
    events = SSEDecoder().decode(stream_bytes(c, [TextDelta("Done.")]))
    names = [e.event for e in events if e.event != "ping"]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert json.loads(events[-2].data)["delta"]["stop_reason"] == "max_tokens"


def test_stream_split_at_every_byte_gives_the_same_events():
    raw = stream_bytes(completion(), [*DELTAS[:3], TextDelta("é—✓"), *DELTAS[4:]])
    whole = SSEDecoder().decode(raw)
    for cut in range(len(raw) + 1):
        dec = SSEDecoder()
        assert dec.decode(raw[:cut]) + dec.decode(raw[cut:]) + dec.flush() == whole, cut


def test_errors_are_anthropic_shaped():
    for status, kind in (
        (400, "invalid_request_error"),
        (404, "not_found_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (529, "overloaded_error"),
    ):
        assert orjson.loads(ANTH.error(status, "bad", "c")) == {
            "type": "error",
            "error": {"type": kind, "message": "bad"},
        }
    w = ANTH.stream_writer(ANTH.parse(body()), response_id="1", model="m", created=1)
    (ev,) = SSEDecoder().decode(w.error("backend died", "backend_disconnected"))
    assert ev.event == "error"
    assert json.loads(ev.data) == {"type": "error", "error": {"type": "api_error", "message": "backend died"}}
    assert w.keepalive() == b'event: ping\ndata: {"type": "ping"}\n\n'
