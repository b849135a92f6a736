import json

import orjson
import pytest

from polarproxy.conversation import Completion, ReasoningDelta, TextDelta, ToolCall, ToolCallEvent, Usage
from polarproxy.dialects import DialectError, route
from polarproxy.dialects.openai_chat import OpenAIChat
from polarproxy.sse import SSEDecoder

CHAT = OpenAIChat()


@pytest.mark.parametrize("harness", ["qwen", "opencode", "pi", "aider"])
def test_every_captured_chat_request_parses(traffic, harness):
    for rec in traffic(harness):
        body = rec["body"]
        assert route(rec["method"], rec["path"]) is not None
        conv = CHAT.parse(body)
        assert len(conv.messages) == len(body["messages"])
        assert conv.stream == bool(body.get("stream"))
        assert len(conv.tools) == len([t for t in body.get("tools", []) if t.get("type") == "function"])
        for raw, msg in zip(body["messages"], conv.messages, strict=True):
            if isinstance(raw.get("content"), str):
                assert msg.content == raw["content"]
            for raw_call, call in zip(raw.get("tool_calls") or [], msg.tool_calls, strict=True):
                assert call.id == raw_call["id"]
                assert call.arguments == raw_call["function"]["arguments"]  # verbatim, never re-serialized


def test_qwen_code_text_part_arrays_and_reasoning_are_read(traffic):
    second = traffic("qwen")[1]["body"]
    conv = CHAT.parse(second)
    user = conv.messages[1]
    assert user.content == "".join(p["text"] for p in second["messages"][1]["content"])
    assistant = conv.messages[4]
    assert assistant.reasoning == "Thinking about the request."
    assert assistant.tool_calls[0].name == "run_shell_command"
    tool = conv.messages[5]
    assert tool.role == "tool" and tool.tool_call_id == "call_000002"
    assert conv.include_usage and conv.sampling.max_tokens == 8000


def test_pi_developer_role_and_max_completion_tokens(traffic):
    conv = CHAT.parse(traffic("pi")[0]["body"])
    assert conv.messages[0].role == "system"
    assert conv.sampling.max_tokens == 8192


def test_aider_temperature_zero_is_kept(traffic):
    conv = CHAT.parse(traffic("aider")[0]["body"])
    assert conv.sampling.temperature == 0.0
    assert conv.tools == []


@pytest.mark.parametrize(
    "body, fragment",
    [
        ([], "JSON object"),
        ({"messages": []}, "non-empty"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "Unknown role 'wizard'"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "'image_url'"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 3}, "n=3"),
        (
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"},
            "max_tokens must be an integer",
        ),
    ],
)
def test_bad_requests_name_the_bad_value(body, fragment):
    with pytest.raises(DialectError) as e:
        CHAT.parse(body)
    assert fragment in e.value.message
    assert e.value.status == 400


def completion():
    return Completion(
        text="Done.",
        reasoning="thought",
        tool_calls=[ToolCall(id="call_1", name="ls", arguments='{"path": "."}')],
        finish_reason="tool_calls",
        usage=Usage(prompt_tokens=10, completion_tokens=5),
    )


def test_non_streamed_response_shape():
    body = orjson.loads(CHAT.response(completion(), response_id="1", model="m", created=1))
    assert body["id"] == "chatcmpl-1"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Done."
    assert choice["message"]["reasoning_content"] == "thought"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "ls", "arguments": '{"path": "."}'}
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


def test_stream_is_read_back_by_the_openai_sdk_accumulator():
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    conv = CHAT.parse(
        {
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    w = CHAT.stream_writer(conv, response_id="1", model="m", created=1)
    c = completion()
    raw = (
        w.start()
        + w.events(
            [
                ReasoningDelta("thou"),
                ReasoningDelta("ght"),
                TextDelta("Done."),
                ToolCallEvent(0, c.tool_calls[0]),
            ]
        )
        + w.finish(c)
    )
    events = SSEDecoder().decode(raw)
    assert events[-1].data == "[DONE]"
    state = ChatCompletionStreamState()
    for ev in events[:-1]:
        state.handle_chunk(ChatCompletionChunk.model_validate(json.loads(ev.data)))
    final = state.get_final_completion()
    msg = final.choices[0].message
    assert msg.content == "Done."
    assert msg.tool_calls[0].function.arguments == '{"path": "."}'
    assert final.choices[0].finish_reason == "tool_calls"
    assert final.usage.total_tokens == 15
