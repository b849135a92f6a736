"""Streamed answers reach mitmproxy's HTTP layer in process (capture/inprocess.py): no second HTTP hop, the
same bytes to the harness, the same records; where the layer cannot be installed, the loopback hop."""

from __future__ import annotations

import asyncio
import socket

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


def test_a_streams_head_goes_to_mitmproxy_while_the_backend_computes_the_first_token(
    make_stub, make_proxy, monkeypatch
):
    """The head's event is made and given to mitmproxy ahead (`prepare_head`), its hook holds it until
    the first token, and then the harness gets it with the first content."""
    from polarproxy.backends.stub import StubBackend

    seen: list[str] = []
    make_event, give, stream = (
        inprocess.LayerSink._head_event,
        inprocess.LayerSink.head_nowait,
        StubBackend._stream,
    )
    hold = responder_module.Responder.hold_head

    def making(self, status, headers):
        seen.append("head made")
        return make_event(self, status, headers)

    def giving(self, status, headers):
        seen.append("head given")
        give(self, status, headers)

    async def holding(self, path, response, client_gone):
        held = path in self.held
        seen.append("hook holds" if held else "hook")
        answer = await hold(self, path, response, client_gone)
        seen.append("hook releases" if held else "hook done")
        return answer

    async def stub_stream(self, w, make):
        def first(n, last):
            if n == 1:
                seen.append("first token")
            return make(n, last)

        return await stream(self, w, first)

    batches: list[list[str]] = []
    drain = inprocess.LayerSink.drain

    async def draining(self):
        batches.append([type(part).__name__ for part in self._queue])
        await drain(self)

    monkeypatch.setattr(inprocess.LayerSink, "_head_event", making)
    monkeypatch.setattr(inprocess.LayerSink, "head_nowait", giving)
    monkeypatch.setattr(inprocess.LayerSink, "drain", draining)
    monkeypatch.setattr(responder_module.Responder, "hold_head", holding)
    monkeypatch.setattr(StubBackend, "_stream", stub_stream)
    proxy = make_proxy(make_stub("one two three", first_token_ms=200).url)
    with httpx.Client(timeout=30) as client:
        assert stream_text(client, proxy.url) == "one two three"
    assert seen == ["head made", "hook holds", "first token", "head given", "hook releases"]
    assert [b for b in batches if b][:2] == [["ResponseHeaders"], ["ResponseData"]]
    assert proxy.proxy.recorder.responder.held == {}


class _Event:
    def __init__(self, status: int, headers: dict[str, str], end: bool) -> None:
        self.status, self.headers, self.end = status, headers, end
        self.response = type("Response", (), {"timestamp_start": 0.0, "status_code": status})()


class _Endpoint:
    """What a LayerSink needs of the responder; no mitmproxy connection (injections find it gone)."""

    def __init__(self) -> None:
        self.connections: dict[str, object] = {}
        self.background: set[asyncio.Task[None]] = set()
        self.held: dict[str, inprocess.HeldHead] = {}


def _layer_sink(endpoint: _Endpoint | None = None, key: str | None = None) -> inprocess.LayerSink:
    parts = inprocess._Parts(
        head=lambda sid, status, headers, end: _Event(status, headers, end),
        data=lambda sid, data: ("data", data),
        end=lambda sid: ("end",),
        failed=lambda sid, message: ("failed", message),
        inject=lambda server, event: event,
    )
    context = type("Context", (), {"client": object(), "server": object()})()
    return inprocess.LayerSink(endpoint, context, 1, parts, key)  # type: ignore[arg-type]


def test_a_held_head_is_given_to_mitmproxy_at_once_and_decided_by_the_answers_head():
    stream = {"content-type": "text/event-stream", "cache-control": "no-cache"}

    async def run() -> None:
        endpoint = _Endpoint()
        sink = _layer_sink(endpoint, "/p/1")
        sink.prepare_head(200, stream)
        held = endpoint.held["/p/1"]
        (given,) = sink._queue
        assert isinstance(given, _Event)
        sink.head_nowait(200, dict(stream))  # the guess was right: that response goes
        assert held.decided.result() is given.response and sink._queue == [given]

        sink = _layer_sink(endpoint, "/p/2")
        sink.prepare_head(200, stream)
        held = endpoint.held["/p/2"]
        sink.head_nowait(400, {"content-type": "application/json", "content-length": "9"})
        assert held.decided.result().status_code == 400  # an error instead: a response of its own

        sink = _layer_sink(endpoint, "/p/3")
        sink.prepare_head(200, stream)
        held = endpoint.held["/p/3"]
        sink.fail("stopped")  # ended without a head: mitmproxy answers the failure that follows
        assert held.decided.result() is inprocess.NO_HEAD

        sink = _layer_sink(endpoint, "/p/4")
        sink.prepare_head(200, stream)
        sink.close()  # the harness hung up before mitmproxy ran the hook: nothing left behind
        assert "/p/4" not in endpoint.held
        await asyncio.sleep(0)  # the injections run (and find no connection)

    asyncio.run(run())


def test_a_prepared_head_is_used_only_when_the_head_is_that_one():
    stream = {"content-type": "text/event-stream", "cache-control": "no-cache"}
    sink = _layer_sink()
    sink.prepare_head(200, stream)
    made = sink._prepared[2]  # type: ignore[index]
    sink.head_nowait(200, dict(stream))
    (given,) = sink._queue
    assert given is made and given.response.timestamp_start > 0
    assert given.headers == {**stream, "transfer-encoding": "chunked"}

    sink = _layer_sink()
    sink.prepare_head(200, stream)
    sink.head_nowait(503, {"content-type": "application/json", "content-length": "2"})  # an error instead
    (given,) = sink._queue
    assert (given.status, given.headers["content-length"], given.end) == (503, "2", False)
    sink.prepare_head(200, stream)  # too late: the head was given
    assert sink._prepared is None


def test_a_head_prepared_before_mitmproxy_asks_for_the_stream_is_handed_on_with_it():
    stream = {"content-type": "text/event-stream"}
    early = responder_module.HandoffSink()
    early.prepare_head(200, stream)
    target = _layer_sink()
    early.attach_nowait(target)
    assert target._prepared is not None and target._prepared[:2] == (200, stream)
    assert not target._queue  # nothing to send yet

    given = responder_module.HandoffSink()
    given.prepare_head(200, stream)
    asyncio.run(given.head(502, {"content-length": "0"}))  # the head came first: it goes, the guess does not
    target = _layer_sink()
    given.attach_nowait(target)
    assert target._prepared is None
    (head,) = target._queue
    assert head.status == 502


@pytest.mark.skipif(not hasattr(socket, "TCP_CORK"), reason="TCP_CORK is Linux's")
def test_a_streams_head_and_first_content_reach_the_harness_together_and_the_connection_is_uncorked(
    make_stub, make_proxy
):
    """One segment: the harness is not woken by a head whose content is still to come (capture/inprocess.py
    corks its connection until both are written), and later writes are not held back."""
    proxy = make_proxy(make_stub("one two three four", first_token_ms=20, per_token_ms=20).url)
    host, port = proxy.url.removeprefix("http://").split(":")
    body = orjson.dumps(BODY)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        for _ in range(5):  # answers after the first on the same connection too
            s.sendall(
                b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (CHAT.encode(), len(body), body)
            )
            first = s.recv(1 << 20)
            assert first.startswith(b"HTTP/1.1 200") and b'"content":"one' in first
            handlers = list(proxy.proxy.recorder.responder.connections.values())
            (corks,) = {
                h.transports[h.client]
                .writer.get_extra_info("socket")
                .getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK)
                for h in handlers
            }
            assert corks == 0  # uncorked right after: the next tokens are not held back
            rest = b""
            while not rest.endswith(b"0\r\n\r\n"):
                rest += s.recv(1 << 20)
            assert b"[DONE]" in rest
