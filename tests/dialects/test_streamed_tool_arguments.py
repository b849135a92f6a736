"""Tool-call arguments parsed from the model's output stream to the harness as they are sampled, where the
wire format streams them (OpenAI Chat, OpenAI Responses, Anthropic); Gemini sends each call whole. Either way the answer
read back from the stream is the parsed completion."""

from __future__ import annotations

import itertools
import json

import pytest

from polarproxy.conversation import Usage
from polarproxy.dialects import DIALECTS
from polarproxy.dialects.replies import reply_parser
from polarproxy.render.output_parser import OutputParser
from polarproxy.sse import SSEDecoder

OUTPUT = (
    "<think>\nplan\n</think>\n\nReading.\n<tool_call>\n"
    '{"name": "read", "arguments": {"path": "a.txt", "lines": [1, 2]}}\n</tool_call>\n<tool_call>\n'
    '{"name": "ls", "arguments": {}}\n</tool_call>'
)
BODIES = {
    "openai_chat": {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]},
    "anthropic": {
        "model": "m",
        "stream": True,
        "max_tokens": 9,
        "messages": [{"role": "user", "content": "x"}],
    },
    "openai_responses": {"model": "m", "stream": True, "input": "x"},
    "gemini": {"contents": [{"role": "user", "parts": [{"text": "x"}]}]},
}
PATHS = {
    "openai_chat": "/v1/chat/completions",
    "anthropic": "/v1/messages",
    "openai_responses": "/v1/responses",
    "gemini": "/v1beta/models/m:streamGenerateContent",
}


def stream(dialect, size):
    counter = itertools.count()
    parser = OutputParser(new_call_id=lambda: f"call_{next(counter)}")
    conv = dialect.parse(BODIES[dialect.name], path=PATHS[dialect.name], query={"alt": "sse"})
    w = dialect.stream_writer(conv, response_id="r1", model="m", created=1)
    raw = w.start()
    for i in range(0, len(OUTPUT), size):
        raw += w.events(parser.feed(OUTPUT[i : i + size]))
    events, completion = parser.finish("stop", Usage(3, 5))
    raw += w.events(events) + w.finish(completion)
    return raw, completion


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
def test_the_streamed_answer_reads_back_as_the_parsed_completion(dialect):
    raw, completion = stream(dialect, 3)
    reply = reply_parser(dialect.name, turns=1)
    for ev in SSEDecoder().decode(raw):
        if ev.data != "[DONE]":
            reply.event(json.loads(ev.data), ev.event)
    got = reply.result().completion
    assert got.text == completion.text == "Reading."
    assert got.reasoning == completion.reasoning == "plan"
    assert [(t.name, json.loads(t.arguments)) for t in got.tool_calls] == [
        ("read", {"path": "a.txt", "lines": [1, 2]}),
        ("ls", {}),
    ]


def argument_pieces(dialect_name, raw):
    pieces = []
    for ev in SSEDecoder().decode(raw):
        if ev.data == "[DONE]":
            continue
        data = json.loads(ev.data)
        if dialect_name == "openai_chat":
            for choice in data["choices"]:
                for tc in choice["delta"].get("tool_calls", []):
                    pieces.append((tc["index"], tc["function"].get("arguments", "")))
        elif data.get("type") == "response.function_call_arguments.delta":
            pieces.append((data["output_index"], data["delta"]))
        elif data.get("type") == "content_block_delta" and data["delta"]["type"] == "input_json_delta":
            pieces.append((data["index"], data["delta"]["partial_json"]))
    return pieces


@pytest.mark.parametrize("name", ["openai_chat", "openai_responses", "anthropic"])
def test_arguments_go_out_in_pieces_that_add_up_to_each_call(name):
    dialect = next(d for d in DIALECTS if d.name == name)
    raw, completion = stream(dialect, 4)
    pieces = argument_pieces(name, raw)
    by_call: dict[int, list[str]] = {}
    for index, piece in pieces:
        by_call.setdefault(index, []).append(piece)
    joined = ["".join(p) for _, p in sorted(by_call.items())]
    assert joined == [t.arguments for t in completion.tool_calls]
    assert len(by_call[min(by_call)]) > 2  # the first call's arguments came in several pieces


def responses_events(output: str, size: int) -> list[dict]:
    dialect = next(d for d in DIALECTS if d.name == "openai_responses")
    counter = itertools.count()
    parser = OutputParser(new_call_id=lambda: f"call_{next(counter)}")
    conv = dialect.parse(BODIES["openai_responses"], path=PATHS["openai_responses"])
    w = dialect.stream_writer(conv, response_id="r1", model="m", created=1)
    raw = w.start()
    for i in range(0, len(output), size):
        raw += w.events(parser.feed(output[i : i + size]))
    events, completion = parser.finish("stop", Usage(3, 5))
    raw += w.events(events) + w.finish(completion)
    return [json.loads(ev.data) for ev in SSEDecoder().decode(raw)]


def test_responses_items_open_in_sampled_order_and_the_final_response_lists_them_as_streamed():
    output = 'Looking.\n<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>\nThen more.'
    events = responses_events(output, 5)
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    assert added == ["message", "function_call", "message"]
    types = [e["type"] for e in events]
    # the call's arguments went out before the text that follows it
    first_args = types.index("response.function_call_arguments.delta")
    later_text = max(i for i, t in enumerate(types) if t == "response.output_text.delta")
    assert first_args < later_text
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    final = events[-1]
    assert final["type"] == "response.completed"
    assert sorted(final["response"]["output"], key=lambda i: i["id"]) == sorted(done, key=lambda i: i["id"])
    assert [i["type"] for i in final["response"]["output"]] == ["message", "function_call", "message"]
    ids = [i["id"] for i in final["response"]["output"]]
    assert len(set(ids)) == 3  # each item has its own ID
    assert json.loads(final["response"]["output"][1]["arguments"]) == {"path": "."}
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_text_after_a_call_sent_back_as_streamed_is_one_assistant_turn():
    """A harness sends the items back as they came (message, call, message): one assistant turn whose text
    is the answer's whole text, so the next call still extends this one (T2)."""
    output = 'Looking.\n<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>\nThen more.'
    events = responses_events(output, 7)
    items = events[-1]["response"]["output"]
    dialect = next(d for d in DIALECTS if d.name == "openai_responses")
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": "x"},
            *[
                {"type": "message", "role": "assistant", "content": i["content"]}
                if i["type"] == "message"
                else {k: i[k] for k in ("type", "call_id", "name", "arguments")}
                for i in items
            ],
            {"type": "function_call_output", "call_id": items[1]["call_id"], "output": "a.txt"},
        ],
    }
    conv = dialect.parse(body, path=PATHS["openai_responses"])
    assistant = [m for m in conv.messages if m.role == "assistant"]
    assert len(assistant) == 1
    texts = [i["content"][0]["text"] for i in items if i["type"] == "message"]
    assert assistant[0].content == "".join(texts)
    assert [c.name for c in assistant[0].tool_calls] == ["ls"]
