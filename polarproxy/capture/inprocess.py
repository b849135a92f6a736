"""Streamed answers handed to mitmproxy's HTTP layer inside this process: no second HTTP hop.

mitmproxy sends an addon-made response in one piece; it streams only what a server sends. So a streamed
call used to leave the addon's request hook pointed at the responder's loopback endpoint (capture/responder.py),
and every chunk crossed a second HTTP/1.1 exchange: written and chunk-encoded by the responder, read from a
socket and parsed again by mitmproxy's HTTP/1 client, before mitmproxy sent it on to the harness.

Here the flow is pointed at the same address, but mitmproxy's HTTP layer gets, for that address, a server
connection whose protocol layer (`InProcessServer`) is fed by the gateway directly: the answer's head,
data and end become mitmproxy's own `ResponseHeaders` / `ResponseData` / `ResponseEndOfMessage` events,
injected into the client connection's handler (`server_event`, the way mitmproxy injects WebSocket and TCP
messages). No socket, no bytes to parse; mitmproxy's stream state machine, flow hooks (`responseheaders`,
`response`, `error`) and the harness-facing HTTP/1 or HTTP/2 encoding are unchanged. No connection is
opened, so the server-connection hooks (`server_connect`, `server_connected`, `server_disconnected`) do
not fire for these streams.

mitmproxy has no option for a server connection of one's own, so `HttpClient` (the layer mitmproxy puts on
a new server connection) is replaced, for the addresses registered here only, by one that installs
`InProcessServer` instead of opening a socket (`install`). Where this mitmproxy lacks what that needs,
`install` returns False and streams take the loopback hop as before. The figures that chose this are in
docs/benchmarks-history.md.

A stream's head is given to mitmproxy before the first token, held by its `responseheaders` hook until
the answer's real head is known (`HeldHead`; docs/how-it-works.md), and the head and first content reach
the harness in one segment (`LayerSink.drain`) (docs/benchmarks-history.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger("polarproxy.inprocess")


class Endpoint(Protocol):
    """What serves an in-process address (the responder)."""

    # mitmproxy's client connection handlers by client connection ID (Proxyserver.connections)
    connections: Mapping[str, Any]
    background: set[asyncio.Task[None]]  # injections no caller waits for (held here until done)
    held: dict[str, HeldHead]  # heads given to mitmproxy ahead of their answers, by the key of the stream

    def claim(self, path: str, sink: LayerSink) -> bool:
        """Begin passing the stream parked under `path` (what mitmproxy requests) to `sink`; False when
        nothing is parked there."""
        ...


_ENDPOINTS: dict[tuple[str, int], Endpoint] = {}
_INSTALLED: bool | None = None


def install() -> bool:
    """Give mitmproxy's HTTP layer in-process server connections for registered addresses; False where this
    mitmproxy's layers are not the ones this module was written against (streams then take the hop)."""
    global _INSTALLED
    if _INSTALLED is not None:
        return _INSTALLED
    try:
        _INSTALLED = _install()
    except Exception:  # another mitmproxy: its internals differ
        log.warning("mitmproxy's HTTP layer is not as expected; streams take the loopback hop", exc_info=True)
        _INSTALLED = False
    return _INSTALLED


def register(address: tuple[str, int], endpoint: Endpoint) -> None:
    _ENDPOINTS[address] = endpoint


def unregister(address: tuple[str, int]) -> None:
    _ENDPOINTS.pop(address, None)


def _install() -> bool:
    from mitmproxy import http
    from mitmproxy.connection import ConnectionState
    from mitmproxy.proxy import events, layer
    from mitmproxy.proxy.layers import http as http_layers
    from mitmproxy.proxy.layers.http import (
        ErrorCode,
        ReceiveHttp,
        RegisterHttpConnection,
        RequestHeaders,
        RequestProtocolError,
        ResponseData,
        ResponseEndOfMessage,
        ResponseHeaders,
        ResponseProtocolError,
    )

    base = http_layers.HttpClient  # an AttributeError here (another mitmproxy) is install()'s False
    if getattr(base, "polarproxy_in_process", False):
        return True

    @dataclass
    class Injected(events.ConnectionEvent):
        """An answer's parts, in order, for their stream (`stream_id`) of the in-process connection. A head
        and the first data go in one event: mitmproxy then writes both in one pass (the head's hook runs
        in between), and the harness is not woken by a head whose content is still to come."""

        http_events: list[Any]

    class InProcessServer(layer.Layer):
        """The protocol layer of an in-process server connection: requests claim a parked stream, whose
        answer comes back as injected events."""

        def __init__(self, context: Any, endpoint: Endpoint) -> None:
            super().__init__(context)
            self.endpoint = endpoint
            self.sinks: dict[int, LayerSink] = {}

        def _handle_event(self, event: Any) -> Any:
            if isinstance(event, Injected):
                for part in event.http_events:
                    sid = part.stream_id
                    if sid in self.sinks:  # else the stream is gone (the harness hung up): drop it
                        if isinstance(part, (ResponseEndOfMessage, ResponseProtocolError)):
                            self.sinks.pop(sid)
                        yield ReceiveHttp(part)
            elif isinstance(event, RequestHeaders):
                sink = LayerSink(self.endpoint, self.context, event.stream_id, parts, event.request.path)
                self.sinks[event.stream_id] = sink
                if not self.endpoint.claim(event.request.path, sink):  # not parked (aborted meanwhile): 404
                    sink.head_nowait(404, {"content-length": "0"})
                    sink.end_nowait()
                    sink.flush_soon()
            elif isinstance(event, RequestProtocolError):  # the harness went away mid-answer
                sink = self.sinks.pop(event.stream_id, None)
                if sink is not None:
                    sink.close()
            # request data, its end and trailers carry nothing (the addon emptied the body); a
            # ConnectionClosed never comes: nothing closes this connection but the client's handler
            yield from ()

    def make_response(status: int, headers: Mapping[str, str]) -> Any:
        fields = tuple((k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items())
        reason = http.status_codes.RESPONSES.get(status, "Status").encode()
        return http.Response(b"HTTP/1.1", status, reason, fields, None, None, time.time(), None)

    parts = _Parts(
        head=lambda sid, status, headers, end: ResponseHeaders(sid, make_response(status, headers), end),
        data=ResponseData,
        end=ResponseEndOfMessage,
        failed=lambda sid, message: ResponseProtocolError(sid, message, ErrorCode.GENERIC_SERVER_ERROR),
        inject=Injected,
    )

    class InProcessAwareHttpClient(base):  # type: ignore[misc,valid-type]
        polarproxy_in_process = True

        def _handle_event(self, event: Any) -> Any:
            start = isinstance(event, events.Start)
            endpoint = _ENDPOINTS.get(self.context.server.address) if start else None
            if endpoint is None:
                return (yield from super()._handle_event(event))
            server = self.context.server
            server.state = ConnectionState.OPEN
            server.timestamp_start = server.timestamp_tcp_setup = time.time()
            server.peername = server.address
            self.child_layer = InProcessServer(self.context, endpoint)
            self._handle_event = self.child_layer.handle_event
            yield from self._handle_event(event)
            yield RegisterHttpConnection(server, None)

    http_layers.HttpClient = InProcessAwareHttpClient
    return True


@dataclass(frozen=True, slots=True)
class _Parts:
    """mitmproxy's event constructors, found by `_install`."""

    head: Callable[[int, int, Mapping[str, str], bool], Any]
    data: Callable[[int, bytes], Any]
    end: Callable[[int], Any]
    failed: Callable[[int, str], Any]
    inject: Callable[[Any, list[Any]], Any]


NO_HEAD = object()  # what a held head is decided as when its answer ended without a head


class HeldHead:
    """A stream's head given to mitmproxy before its answer's head is known (`LayerSink.prepare_head`):
    mitmproxy runs the head's hook while the backend works, and the hook waits on `decided` (see
    `Responder.hold_head`) for the response to send: this head, another one (an error instead), or
    `NO_HEAD` when the answer ended without one (mitmproxy then answers the failure that follows as when
    no head was given). Nothing reaches the harness before."""

    __slots__ = ("decided",)

    def __init__(self) -> None:
        self.decided: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def give(self, response: Any) -> None:
        if not self.decided.done():
            self.decided.set_result(response)


class LayerSink:
    """A streamed answer as mitmproxy events for one stream of an in-process connection (the responder's
    `ChunkedSink`, without the bytes). Parts are injected in order; `send`/`end`/`drain` wait until they
    are through mitmproxy and the harness's connection has room."""

    def __init__(
        self, endpoint: Endpoint, context: Any, stream_id: int, parts: _Parts, key: str | None = None
    ) -> None:
        self._endpoint = endpoint
        self.key = key  # the stream's name in `endpoint.held` (None: its head is not given ahead)
        self._client, self._server, self._sid, self._parts = context.client, context.server, stream_id, parts
        self._queue: list[Any] = []
        self._lock = asyncio.Lock()
        self.ended = False
        self.closed = False  # the harness hung up: parts are dropped
        self._task: asyncio.Task[None] | None = None
        self._prepared: tuple[int, dict[str, str], Any] | None = None  # (status, headers, head event)
        self._headed = False
        self._held: HeldHead | None = None
        self._cork = False  # the next injection is the head's (see `drain`)

    # -- the Sink interface (capture/gateway.py) and HandoffSink's target interface (capture/responder.py)

    def _head_event(self, status: int, headers: dict[str, str]) -> Any:
        end = headers.get("content-length") == "0"
        if "content-length" not in headers:
            headers = {**headers, "transfer-encoding": "chunked"}  # how mitmproxy frames it for HTTP/1
        return self._parts.head(self._sid, status, headers, end)  # an end follows even then

    def prepare_head(self, status: int, headers: dict[str, str]) -> None:
        """Make the head's event ahead, and with a `key`, give it to mitmproxy now, held (`HeldHead`): what
        mitmproxy does with a head (its checks, the `responseheaders` hook of every addon; ~0.3 ms on a
        core that was idle) is then done while the backend works, not on the way to the first token."""
        if self._prepared is not None or self._headed:
            return
        event = self._head_event(status, headers)
        self._prepared = (status, headers, event)
        if self.key is not None and not (self._queue or self.ended or self.closed):
            self._held = self._endpoint.held[self.key] = HeldHead()
            self._queue.append(event)
            self.flush_soon()

    def head_nowait(self, status: int, headers: dict[str, str]) -> None:
        prepared, self._prepared, self._headed = self._prepared, None, True
        if prepared is not None and prepared[0] == status and prepared[1] == headers:
            event = prepared[2]
            event.response.timestamp_start = time.time()  # when the head was given, as if made now
        else:
            event = self._head_event(status, headers)
        self._cork = True
        if self._held is not None:  # mitmproxy has a head already, held by its hook: send this response
            self._held.give(event.response)
        else:
            self._queue.append(event)

    def _put_data(self, data: bytes) -> None:
        if self.closed:
            raise ConnectionResetError("the harness closed the connection")
        if data and not self.ended:
            self._queue.append(self._parts.data(self._sid, data))

    def send_nowait(self, data: bytes) -> None:
        self._put_data(data)
        self.flush_soon()  # a timer's keep-alive has no one to wait for it

    def end_nowait(self) -> None:
        if not self.ended:
            self._queue.append(self._parts.end(self._sid))
            self.ended = True

    async def head(self, status: int, headers: dict[str, str]) -> None:
        self.head_nowait(status, headers)

    async def send(self, data: bytes) -> None:
        self._put_data(data)
        await self.drain()

    async def end(self) -> None:
        self.end_nowait()
        await self.drain()

    def close(self) -> None:
        """The harness hung up: what is sent from now on is dropped (and a held head is not waited for)."""
        self.closed = True
        if self._held is not None and self.key is not None:
            self._endpoint.held.pop(self.key, None)  # its hook may never run: the stream is errored

    def fail(self, message: str) -> None:
        """End the stream as failed (the harness's connection is closed): serving stopped before the end."""
        if not self.ended:
            if self._held is not None:
                self._held.give(NO_HEAD)  # no head was given (else a no-op)
            self._queue.append(self._parts.failed(self._sid, message))
            self.ended = True
            self.flush_soon()

    def flush_soon(self) -> None:
        """Inject what is queued from a task (for callers that cannot wait: timers, mitmproxy's own events)."""
        if self._queue and (self._task is None or self._task.done()):
            self._task = task = asyncio.ensure_future(self._drain_quietly())
            background = self._endpoint.background
            background.add(task)
            task.add_done_callback(background.discard)

    async def _drain_quietly(self) -> None:
        with contextlib.suppress(ConnectionError):
            while self._queue:  # parts queued while it waited are its too (nothing else was scheduled)
                await self.drain()

    async def drain(self) -> None:
        """Inject what is queued, in order, then wait until the harness's connection has room."""
        # one injector at a time: a later caller finds the queue empty, or holding only its own parts
        async with self._lock:
            handler = self._endpoint.connections.get(self._client.id)
            if handler is None:  # the harness's connection is gone
                self._queue.clear()
                self.close()
            while self._queue:  # what is queued goes as one event (parts queued meanwhile, as the next)
                parts, self._queue = self._queue, []
                # The head and what follows it: mitmproxy writes them one after the other once the head's
                # hook has run, so the first write would wake the harness, which then parses the head
                # while the content waits (on a busy machine, on this core). The connection is corked
                # until both are written: one segment, one wake-up.
                corked = _cork(handler, self._client) if self._cork else None
                self._cork = False
                try:
                    await handler.server_event(self._parts.inject(self._server, parts))
                finally:
                    if corked is not None:
                        # mitmproxy writes them in the task that runs the head's hook; that task was woken
                        # (by the lock this call held, or by `HeldHead.give`) before this is scheduled, and
                        # writes without waiting again, so runs first
                        asyncio.get_running_loop().call_soon(_uncork, corked)
        if self.closed:
            if self.ended:
                return
            raise ConnectionResetError("the harness closed the connection")
        io = handler.transports.get(self._client)
        writer = getattr(io, "writer", None)
        if writer is not None:
            with contextlib.suppress(OSError, RuntimeError):
                await writer.drain()


# Linux's TCP_CORK: a connection's writes are held (up to 200 ms) until it is uncorked, then sent together.
_CORK: int | None = getattr(socket, "TCP_CORK", None)


def _cork(handler: Any, client: Any) -> Any:
    """Cork the harness's connection (its socket, to uncork); None where that cannot be done."""
    if _CORK is None:
        return None
    writer = getattr(handler.transports.get(client), "writer", None)
    sock = writer.get_extra_info("socket") if writer is not None else None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, _CORK, 1)
    except (AttributeError, OSError):  # no socket, not TCP (QUIC), closed
        return None
    return sock


def _uncork(sock: Any) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, _CORK, 0)
