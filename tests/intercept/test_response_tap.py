"""Provider responses read as they stream past (no sockets): every split of a stream reads the same."""

from __future__ import annotations

import gzip
import json

import pytest
from standin import (
    ANTHROPIC_JSON,
    ANTHROPIC_SSE,
    CHAT_JSON,
    CHAT_SSE,
    GEMINI_JSON,
    GEMINI_SSE,
    RESPONSE_OBJ,
    RESPONSES_SSE,
)

from polarproxy.capture.intercept.providers import Providers
from polarproxy.capture.intercept.tap import ResponseTap
from polarproxy.dialects.replies import reply_parser

STREAMS = {
    "openai_chat": CHAT_SSE,
    "openai_responses": RESPONSES_SSE,
    "anthropic": ANTHROPIC_SSE,
    "gemini": GEMINI_SSE,
}
BODIES = {
    "openai_chat": CHAT_JSON,
    "openai_responses": RESPONSE_OBJ,
    "anthropic": ANTHROPIC_JSON,
    "gemini": GEMINI_JSON,
}


def _tap(dialect: str, ctype: str = "text/event-stream", enc: str = "") -> ResponseTap:
    return ResponseTap(reply_parser(dialect, turns=1), content_type=ctype, content_encoding=enc, started=0.0)


@pytest.mark.parametrize("dialect", list(STREAMS))
def test_stream_split_at_every_byte_offset_reads_the_same(dialect):
    data = b"".join(STREAMS[dialect])
    whole = _tap(dialect)
    assert whole.feed(data) == data
    expected = whole.close()
    assert expected.complete and whole.problem is None and whole.first_output_at is not None
    for cut in range(1, len(data)):
        tap = _tap(dialect)
        assert tap.feed(data[:cut]) + tap.feed(data[cut:]) + tap.feed(b"") == data
        got = tap.close()
        assert got.completion == expected.completion, cut
        assert tap.text() == data.decode()


@pytest.mark.parametrize("dialect", list(BODIES))
def test_a_gzipped_body_is_read_and_passed_on_compressed(dialect):
    raw = gzip.compress(json.dumps(BODIES[dialect]).encode())
    tap = _tap(dialect, "application/json", "gzip")
    assert tap.feed(raw[:7]) + tap.feed(raw[7:]) == raw
    reply = tap.close()
    assert reply.complete and tap.problem is None and reply.usage_reported
    assert json.loads(tap.text()) == BODIES[dialect]


def test_a_stream_that_stops_early_is_incomplete_with_what_arrived():
    tap = _tap("anthropic")
    for chunk in ANTHROPIC_SSE[:9]:
        tap.feed(chunk)
    reply = tap.close()
    assert not reply.complete and reply.completion.text == "Listing." and reply.completion.tool_calls == []


def test_an_unknown_content_encoding_is_a_recorded_problem_not_an_error():
    tap = _tap("openai_chat", "application/json", "compress")
    assert tap.feed(b"\x1f\x9d...") == b"\x1f\x9d..."
    tap.close()
    assert tap.problem == "unsupported Content-Encoding 'compress'"


def test_gemini_json_array_stream_is_read_whole():
    chunks = [json.loads(c.decode().removeprefix("data: ")) for c in GEMINI_SSE]
    tap = _tap("gemini", "application/json")
    tap.feed(json.dumps(chunks).encode())
    reply = tap.close()
    assert reply.complete and reply.completion.text == "Hello." and reply.completion.usage.prompt_tokens == 8


def test_providers_match_known_hosts_and_paths_and_user_patterns():
    p = Providers.of(["*.openai.azure.com", "llm.internal:8443"])
    assert p.match("api.openai.com", 443, "POST", "/v1/chat/completions").name == "openai_chat"
    assert p.match("api.openai.com", 443, "POST", "/v1/responses").name == "openai_responses"
    assert p.match("api.openai.com", 443, "GET", "/v1/models") is None
    assert p.match("api.anthropic.com", 443, "POST", "/v1/messages").name == "anthropic"
    assert p.match("api.anthropic.com", 443, "POST", "/v1/chat/completions") is None
    g = "/v1beta/models/gemini-2.5-pro:streamGenerateContent"
    assert p.match("generativelanguage.googleapis.com", 443, "POST", g).name == "gemini"
    assert p.match("example.com", 443, "POST", "/v1/chat/completions") is None
    assert (
        p.match("x.openai.azure.com", 443, "POST", "/openai/deployments/d/chat/completions").name
        == "openai_chat"
    )
    assert p.match("llm.internal", 8443, "POST", "/v1/messages").name == "anthropic"
    assert p.match("llm.internal", 443, "POST", "/v1/messages") is None
    import re

    assert any(re.search(rx, "x.openai.azure.com:443") for rx in p.allow_hosts())
    assert not any(re.search(rx, "downloads.example.test:443") for rx in p.allow_hosts())
    with pytest.raises(ValueError, match="Bad --host pattern 'http://x'"):
        Providers.of(["http://x"])


def test_a_websocket_other_than_responses_is_reported_once_as_unrecorded(caplog):
    from mitmproxy.test import tflow

    from polarproxy.capture.intercept.addon import Interceptor

    addon = Interceptor(writer=None, episode_id="ep_x", providers=Providers.of([]))  # type: ignore[arg-type]
    flow = tflow.twebsocketflow()
    flow.request.headers["host"] = "api.openai.com"
    flow.request.path = "/v1/realtime?key=secret-k"
    with caplog.at_level("WARNING", logger="polarproxy.intercept"):
        addon.websocket_start(flow)
        addon.websocket_start(flow)
    (record,) = caplog.records
    assert "api.openai.com/v1/realtime" in record.getMessage() and "unrecorded" in record.getMessage()
    assert "secret-k" not in record.getMessage()
    other = tflow.twebsocketflow()
    other.request.headers["host"] = "chat.example.com"
    addon.websocket_start(other)
    assert len(caplog.records) == 1
    responses = tflow.twebsocketflow()
    responses.request.headers["host"] = "api.openai.com"
    responses.request.path = "/v1/responses"
    addon.websocket_start(responses)  # recorded (test_intercept_websocket.py), so not reported
    assert len(caplog.records) == 1


async def test_a_websocket_call_that_cannot_be_recorded_is_cut_off_with_an_error_event(tmp_path):
    import orjson
    from mitmproxy.test import tflow
    from mitmproxy.websocket import WebSocketMessage
    from wsproto.frame_protocol import Opcode

    from polarproxy.capture.intercept.addon import Interceptor
    from polarproxy.store.store import Store
    from polarproxy.store.writer import StoreWriter

    writer = StoreWriter(Store.open(str(tmp_path / "x.db")))
    # an episode the store does not hold: begin_call fails, as it would on a full disk or a lost database
    addon = Interceptor(writer=writer, episode_id="ep_missing", providers=Providers.of([]))
    flow = tflow.twebsocketflow(messages=False)
    flow.request.headers["host"] = "api.openai.com"
    flow.request.path = "/v1/responses"
    addon.websocket_start(flow)

    async def arrive(from_client: bool, data: dict) -> WebSocketMessage:
        msg = WebSocketMessage(Opcode.TEXT, from_client, orjson.dumps(data))
        flow.websocket.messages.append(msg)
        await addon.websocket_message(flow)
        return msg

    await arrive(True, {"type": "response.create", "model": "gpt-5", "input": "hi", "stream": True})
    first = await arrive(False, {"type": "response.created", "response": {"id": "r1", "output": []}})
    cut = orjson.loads(first.content)
    assert cut["type"] == "error" and cut["status"] == 502 and "cannot record" in cut["error"]["message"]
    later = await arrive(False, {"type": "response.output_text.delta", "delta": "unrecorded"})
    assert later.dropped  # the rest of the unrecorded answer does not reach the client
    await addon.websocket_end(flow)
    writer.close()
