import json

import orjson
import pytest

from polarproxy.conversation import (
    Completion,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallEvent,
    Usage,
)
from polarproxy.dialects import DialectError, route
from polarproxy.dialects.base import answer_signature
from polarproxy.dialects.openai_responses import OpenAIResponses
from polarproxy.dialects.openai_responses_output import split_tool_name
from polarproxy.sse import KEEPALIVE, SSEDecoder

RESP = OpenAIResponses()


def _function_tools(body):
    n = 0
    for t in body.get("tools", []):
        if t["type"] == "function":
            n += 1
        elif t["type"] == "namespace":
            n += sum(1 for u in t["tools"] if u.get("type", "function") == "function")
    return n


@pytest.mark.parametrize("harness", ["codex", "pi-resp"])
def test_every_captured_responses_request_parses(traffic, harness):
    for rec in traffic(harness):
        body = rec["body"]
        assert route(rec["method"], rec["path"]).name == "openai_responses"
        conv = RESP.parse(body, path=rec["path"], query=rec.get("query") or {})
        assert conv.stream == bool(body.get("stream"))
        assert conv.model == body["model"]
        assert len(conv.tools) == _function_tools(body)
        assert conv.messages[0].role == "system"  # the developer item
        calls = [i for i in body["input"] if i.get("type") == "function_call"]
        got = [c for m in conv.messages for c in m.tool_calls]
        assert [(c.id, c.name, c.arguments) for c in got] == [
            (i["call_id"], i["name"], i["arguments"])
            for i in calls  # verbatim, never re-serialized
        ]
        outputs = [i for i in body["input"] if i.get("type") == "function_call_output"]
        tools = [m for m in conv.messages if m.role == "tool"]
        assert [(m.tool_call_id, m.content) for m in tools] == [(o["call_id"], o["output"]) for o in outputs]


def test_codex_facts(traffic):
    first, second = (r["body"] for r in traffic("codex"))
    conv = RESP.parse(first)
    assert "instructions" not in first
    dev = first["input"][0]
    assert dev["role"] == "developer"
    assert conv.messages[0].role == "system" and conv.messages[0].content == dev["content"][0]["text"]
    assert [m.role for m in conv.messages] == ["system", "system", "user", "user"]
    names = [t.name for t in conv.tools]
    # the namespace's inner function tools are flattened as NAMESPACE.NAME; web_search stays out
    ns = next(t for t in first["tools"] if t["type"] == "namespace")
    assert [f"{ns['name']}.{u['name']}" for u in ns["tools"]] == [n for n in names if "." in n]
    assert "exec_command" in names and not any("web_search" in n for n in names)
    assert any(t["type"] == "web_search" for t in first["tools"])
    inner = next(t for t in conv.tools if t.name == f"{ns['name']}.{ns['tools'][0]['name']}")
    assert inner.parameters == ns["tools"][0]["parameters"]
    assert conv.tool_choice == "auto" and conv.stream

    conv2 = RESP.parse(second)
    reasoning = next(i for i in second["input"] if i.get("type") == "reasoning")
    call = next(i for i in second["input"] if i.get("type") == "function_call")
    output = next(i for i in second["input"] if i.get("type") == "function_call_output")
    assert output["id"] != output["call_id"]  # the output item's own id is not the call's
    assistant, tool = conv2.messages[-2:]
    assert assistant.role == "assistant" and assistant.content == ""
    assert assistant.reasoning == reasoning["summary"][0]["text"]
    assert assistant.signature == reasoning["encrypted_content"]
    assert assistant.tool_calls == [
        ToolCall(id=call["call_id"], name=call["name"], arguments=call["arguments"])
    ]
    assert tool.role == "tool" and tool.tool_call_id == call["call_id"] == output["call_id"]
    assert tool.content == output["output"]


def test_pi_resp_facts(traffic):
    first, second = (r["body"] for r in traffic("pi-resp"))
    conv = RESP.parse(first)
    assert conv.messages[0].role == "system" and conv.messages[0].content == first["input"][0]["content"]
    assert conv.sampling.max_tokens == 8192
    conv2 = RESP.parse(second)
    assistant = conv2.messages[-2]
    assert assistant.signature == "FAKE_ENCRYPTED_REASONING_resp_000001"
    assert assistant.tool_calls[0].name == "bash"


def test_merging_instructions_strings_and_parts():
    conv = RESP.parse(
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": "hi"},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "r"}],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Looking."}],
                },
                {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "a", "arguments": "{}"},
                {"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "b", "arguments": "{}"},
                {
                    "type": "function_call",
                    "call_id": "c3",
                    "name": "spawn_agent",
                    "namespace": "multi",
                    "arguments": "{}",
                },
                {
                    "type": "function_call_output",
                    "call_id": "c1",
                    "output": [{"type": "input_text", "text": "1"}],
                },
                {"type": "function_call_output", "call_id": "c2", "output": "2"},
                {"type": "function_call_output", "call_id": "c3", "output": "3"},
                {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
                {"role": "system", "content": "late"},
            ],
            "tools": [
                {"type": "function", "name": "a", "parameters": {"type": "object"}, "strict": True},
                {"type": "local_shell"},
                {"type": "custom", "name": "apply_patch"},
            ],
            "tool_choice": {"type": "function", "name": "a"},
            "reasoning": {"effort": "high"},
            "temperature": 0,
            "top_p": 0.5,
            "max_output_tokens": 7,
            "store": False,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": "k",
            "parallel_tool_calls": False,
            "text": {"verbosity": "low"},
        }
    )
    assert [m.role for m in conv.messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "tool",
        "assistant",
        "system",
    ]
    turn = conv.messages[2]
    assert turn.reasoning == "r" and turn.content == "Looking." and turn.signature is None
    assert [c.name for c in turn.tool_calls] == ["a", "b", "multi.spawn_agent"]
    assert conv.messages[3].content == "1"
    assert conv.messages[6].content == "No."
    assert [t.name for t in conv.tools] == ["a"]
    assert conv.sampling.temperature == 0.0 and conv.sampling.top_p == 0.5 and conv.sampling.max_tokens == 7
    assert conv.tool_choice == {"type": "function", "name": "a"}
    assert not conv.stream


def test_string_input_and_trailing_reasoning():
    conv = RESP.parse({"input": "hello"})
    assert [(m.role, m.content) for m in conv.messages] == [("user", "hello")]
    conv = RESP.parse(
        {
            "input": [
                {"role": "user", "content": "x"},
                {"type": "reasoning", "summary": [], "encrypted_content": "s"},
            ]
        }
    )
    assert conv.messages[-1].role == "assistant" and conv.messages[-1].signature == "s"


@pytest.mark.parametrize(
    "body, fragment",
    [
        ([], "JSON object"),
        ({"model": "m"}, "input is required"),
        ({"input": 3}, "string or an array"),
        ({"input": []}, "at least one"),
        ({"input": "x", "previous_response_id": "resp_1"}, "no server-side state"),
        ({"input": [{"role": "wizard", "content": "x"}]}, "Unknown role 'wizard'"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "'input_image'",
        ),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "'input_file'"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "item_reference"),
        ({"input": [{"type": "web_search_call", "id": "x"}]}, "'web_search_call'"),
        ({"input": [{"type": "function_call", "name": "a", "arguments": "{}"}]}, "call_id"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "call_id"),
        ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name"),
        ({"input": "x", "max_output_tokens": "many"}, "max_output_tokens must be an integer"),
    ],
)
def test_bad_requests_name_the_bad_value(body, fragment):
    with pytest.raises(DialectError) as e:
        RESP.parse(body)
    assert fragment in e.value.message
    assert e.value.status == 400


def test_routes():
    assert RESP.matches("POST", "/v1/responses") and RESP.matches("POST", "/openai/v1/responses/")
    assert not RESP.matches("GET", "/v1/responses") and not RESP.matches("POST", "/v1/chat/completions")
    assert split_tool_name("ns.fn") == ("ns", "fn") and split_tool_name("fn") == (None, "fn")


def completion(finish="tool_calls", reasoning="thought", text="Done."):
    return Completion(
        text=text,
        reasoning=reasoning,
        tool_calls=[
            ToolCall(id="call_1", name="ls", arguments='{"path": "."}'),
            ToolCall(id="call_2", name="multi.spawn_agent", arguments="{}"),
        ],
        finish_reason=finish,
        usage=Usage(prompt_tokens=10, completion_tokens=5),
        signature=answer_signature("1"),
    )


def test_non_streamed_response_validates_as_the_sdk_model():
    from openai.types.responses import Response

    body = orjson.loads(RESP.response(completion(), response_id="1", model="m", created=1))
    r = Response.model_validate(body)
    assert r.id == "resp_1" and r.status == "completed" and r.model == "m"
    assert [o.type for o in r.output] == ["reasoning", "message", "function_call", "function_call"]
    rs, msg, fc, fc2 = r.output
    assert rs.id.startswith("rs_") and rs.summary[0].text == "thought"
    assert rs.encrypted_content == answer_signature("1")
    assert msg.id.startswith("msg_") and r.output_text == "Done."
    assert fc.id.startswith("fc_") and fc.call_id == "call_1" and fc.name == "ls"
    assert fc.arguments == '{"path": "."}' and fc.status == "completed"
    assert (fc2.namespace, fc2.name) == ("multi", "spawn_agent")
    assert r.usage.input_tokens == 10 and r.usage.output_tokens == 5 and r.usage.total_tokens == 15


def test_length_is_incomplete_and_no_reasoning_no_item():
    from openai.types.responses import Response

    c = Completion(text="Partial", finish_reason="length", usage=Usage(1, 2))
    r = Response.model_validate(orjson.loads(RESP.response(c, response_id="2", model="m", created=1)))
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["message"]


def test_error_body_is_openai_shaped():
    err = orjson.loads(RESP.error(400, "bad", "invalid_request_error"))["error"]
    assert err == {
        "message": "bad",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_request_error",
    }


def stream_bytes(c, deltas):
    w = RESP.stream_writer(RESP.parse({"input": "x", "stream": True}), response_id="1", model="m", created=1)
    return w, w.start() + w.events(deltas) + w.keepalive() + w.finish(c)


DELTAS = [
    ReasoningDelta("thou"),
    ReasoningDelta("ght"),
    TextDelta("Do"),
    TextDelta("ne."),
    # the first call's arguments stream in pieces as sampled; the second was parsed whole
    ToolCallDelta(0, "call_1", "ls", ""),
    ToolCallDelta(0, "call_1", "ls", '{"pa'),
    ToolCallDelta(0, "call_1", "ls", 'th": "."}'),
    ToolCallEvent(0, completion().tool_calls[0]),
    ToolCallEvent(1, completion().tool_calls[1]),
]


def accumulate(events):
    from openai import omit
    from openai.lib.streaming.responses import ResponseStreamState
    from openai.types.responses import ResponseStreamEvent
    from pydantic import TypeAdapter

    adapter = TypeAdapter(ResponseStreamEvent)
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    out = []
    for ev in events:
        parsed = adapter.validate_python(json.loads(ev.data))
        assert parsed.type == ev.event
        out += state.handle_event(parsed)
    return out


def test_stream_is_accumulated_by_the_openai_sdk():
    from openai.types.responses import Response

    c = completion()
    _, raw = stream_bytes(c, DELTAS)
    events = SSEDecoder().decode(raw)
    kinds = [e.event for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    seqs = [json.loads(e.data)["sequence_number"] for e in events]
    assert seqs == sorted(set(seqs)) and seqs[0] == 0
    # items open and close in order: reasoning, message, then each call
    item_events = [(e.event, json.loads(e.data)["output_index"]) for e in events if "output_item" in e.event]
    assert item_events == [
        ("response.output_item.added", 0),
        ("response.output_item.done", 0),
        ("response.output_item.added", 1),
        ("response.output_item.done", 1),
        ("response.output_item.added", 2),
        ("response.output_item.done", 2),
        ("response.output_item.added", 3),
        ("response.output_item.done", 3),
    ]
    sdk_events = accumulate(events)
    text_snapshots = [e.snapshot for e in sdk_events if e.type == "response.output_text.delta"]
    assert text_snapshots == ["Do", "Done."]  # the SDK's own running text
    arg_snapshots = [e.snapshot for e in sdk_events if e.type == "response.function_call_arguments.delta"]
    assert arg_snapshots == ['{"pa', '{"path": "."}', "{}"]
    final = sdk_events[-1].response
    assert sdk_events[-1].type == "response.completed"
    assert final.output_text == "Done." and final.status == "completed"
    calls = [o for o in final.output if o.type == "function_call"]
    assert [(f.call_id, f.name, f.arguments) for f in calls] == [
        ("call_1", "ls", '{"path": "."}'),
        ("call_2", "spawn_agent", "{}"),
    ]
    assert final.output[0].encrypted_content == answer_signature("1")
    # the completed event carries exactly the object the non-streamed response builds
    last = json.loads(events[-1].data)["response"]
    assert last == orjson.loads(RESP.response(c, response_id="1", model="m", created=1))
    Response.model_validate(last)
    done = [json.loads(e.data)["item"] for e in events if e.event == "response.output_item.done"]
    assert done == last["output"]


def test_stream_without_reasoning_and_incomplete():
    c = Completion(text="Hi", finish_reason="length", usage=Usage(1, 2), signature=answer_signature("1"))
    _, raw = stream_bytes(c, [TextDelta("Hi")])
    events = SSEDecoder().decode(raw)
    assert events[-1].event == "response.incomplete"
    last = json.loads(events[-1].data)["response"]
    assert last == orjson.loads(RESP.response(c, response_id="1", model="m", created=1))
    assert last["incomplete_details"] == {"reason": "max_output_tokens"}
    assert not any("reasoning" in e.event for e in events)
    accumulate(events)


def test_empty_reasoning_still_gets_its_item_first():
    c = Completion(text="", reasoning="", usage=Usage(1, 2), signature=answer_signature("1"))
    _, raw = stream_bytes(c, [])
    events = SSEDecoder().decode(raw)
    last = json.loads(events[-1].data)["response"]
    assert last == orjson.loads(RESP.response(c, response_id="1", model="m", created=1))
    assert [o["type"] for o in last["output"]] == ["reasoning"]
    accumulate(events)


def test_sse_split_at_every_byte_offset_gives_the_same_events():
    _, raw = stream_bytes(completion(), DELTAS)
    whole = SSEDecoder().decode(raw)
    for cut in range(len(raw) + 1):
        d = SSEDecoder()
        assert d.decode(raw[:cut]) + d.decode(raw[cut:]) + d.flush() == whole


def test_error_mid_stream_and_keepalive():
    from openai.types.responses import ResponseErrorEvent, ResponseFailedEvent

    w = RESP.stream_writer(RESP.parse({"input": "x"}), response_id="1", model="m", created=1)
    raw = w.start() + w.events([TextDelta("a")]) + w.error("backend died", "backend_error")
    events = SSEDecoder().decode(raw)
    err = ResponseErrorEvent.model_validate(json.loads(events[-2].data))
    assert events[-2].event == "error" and err.code == "backend_error" and err.message == "backend died"
    failed = ResponseFailedEvent.model_validate(json.loads(events[-1].data))
    assert failed.response.status == "failed" and "backend died" in failed.response.error.message
    seqs = [json.loads(e.data)["sequence_number"] for e in events]
    assert seqs == list(range(len(events)))
    assert w.error("backend died", "backend_error") == raw[-len(w.error("x", "y")) :]  # same bytes again
    assert w.keepalive() == KEEPALIVE and SSEDecoder().decode(KEEPALIVE) == []
