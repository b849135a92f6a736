"""Streamed answers reach mitmproxy's HTTP layer in process (capture/inprocess.py): no second HTTP hop, the
same bytes to the harness, the same records; where the layer cannot be installed, the loopback hop."""

from __future__ import annotations

import httpx
import orjson
import pytest

from polarproxy.capture import inprocess
from polarproxy.capture import responder as responder_module
from polarproxy.sse import SSEDecoder

CHAT = "/v1/chat/completions"
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64, "stream": True}


@pytest.fixture
def hops(monkeypatch):
    """The connections made to the responder's loopback endpoint (the second hop)."""
    made: list[int] = []
    handle = responder_module.Responder._handle

    async def counting(self, reader, writer):
        made.append(1)
        return await handle(self, reader, writer)

    monkeypatch.setattr(responder_module.Responder, "_handle", counting)
    return made


def stream_text(client: httpx.Client, url: str) -> str:
    with client.stream("POST", url + CHAT, json=BODY) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = SSEDecoder().decode(r.read())
    assert events[-1].data == "[DONE]"
    return "".join(
        choice["delta"].get("content") or ""
        for e in events[:-1]
        for choice in orjson.loads(e.data)["choices"]
    )


def test_streams_pass_through_mitmproxys_layer_in_process_with_no_second_hop(make_stub, make_proxy, hops):
    proxy = make_proxy(make_stub("one two three four five", per_token_ms=2).url)
    assert proxy.proxy.recorder.responder.in_process
    with httpx.Client(timeout=30) as client:  # one keep-alive connection: its in-process server is reused
        texts = [stream_text(client, proxy.url) for _ in range(3)]
    assert texts == ["one two three four five"] * 3
    assert hops == []
    recs = proxy.store.list_calls(proxy.episode_id)
    assert [(c.status, c.stream) for c in recs] == [("ok", True)] * 3


def test_where_mitmproxys_layer_cannot_take_them_streams_take_the_loopback_hop(
    make_stub, make_proxy, hops, monkeypatch
):
    monkeypatch.setattr(inprocess, "install", lambda: False)
    proxy = make_proxy(make_stub("one two three").url)
    assert not proxy.proxy.recorder.responder.in_process
    with httpx.Client(timeout=30) as client:
        assert stream_text(client, proxy.url) == "one two three"
    assert hops == [1]
    (c,) = proxy.store.list_calls(proxy.episode_id)
    assert c.status == "ok"


def test_a_serving_failure_mid_stream_closes_the_harness_connection_and_the_proxy_keeps_serving(
    make_stub, make_proxy, monkeypatch
):
    proxy = make_proxy(make_stub("one two three").url)
    recorder = proxy.proxy.recorder
    serve = recorder.gateway.serve
    failed = []

    async def failing(call, sink):  # a bug in the gateway after the first bytes went out
        if not failed:
            failed.append(call.flow_id)
            await sink.head(200, {"content-type": "text/event-stream"})
            await sink.send(b"data: {}\n\n")
            raise RuntimeError("a bug")
        await serve(call, sink)

    monkeypatch.setattr(recorder.responder, "_serve_call", failing)
    with (
        pytest.raises(httpx.RemoteProtocolError),  # the body ends before its last chunk
        httpx.stream("POST", proxy.url + CHAT, json=BODY, timeout=30) as r,
    ):
        assert r.status_code == 200
        r.read()
    with httpx.Client(timeout=30) as client:
        assert stream_text(client, proxy.url) == "one two three"


def test_a_path_with_nothing_parked_is_not_claimed():
    responder = responder_module.Responder(serve_call=None)  # type: ignore[arg-type]
    assert not responder.claim(responder_module.PATH_PREFIX + "nope", sink=None)  # type: ignore[arg-type]
    assert not responder.claim("/v1/chat/completions", sink=None)  # type: ignore[arg-type]


def test_a_stream_that_is_no_longer_parked_when_mitmproxy_asks_for_it_gets_a_404(
    make_stub, make_proxy, monkeypatch
):
    proxy = make_proxy(make_stub("one two three").url)
    responder = proxy.proxy.recorder.responder
    monkeypatch.setattr(responder, "serve_stream", lambda call: responder_module.PATH_PREFIX + call.flow_id)
    with httpx.Client(timeout=10) as client:
        r = client.post(proxy.url + CHAT, json=BODY)
        assert (r.status_code, r.content) == (404, b"")
        monkeypatch.undo()
        assert stream_text(client, proxy.url) == "one two three"  # the same connection serves on
