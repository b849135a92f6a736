"""Where the gateway's answers go: in place for whole answers, into mitmproxy's HTTP layer for streams.

mitmproxy sends an addon-made response in one piece, but streams what a server sends. Either way the
addon starts serving a call inside its request hook, so rendering and the backend's first token do not
wait for anything else:

- a non-streamed call (`serve_inline`) is written into a buffer, and the addon hands mitmproxy the
  finished response;
- a streamed call (`serve_stream`) is written into a `HandoffSink` while the addon points the flow at
  this responder's address; when mitmproxy's request for it arrives (by flow ID), what was buffered goes
  out and the rest streams straight through. mitmproxy's connection to that address is in process
  (`claim`, capture/inprocess.py): the answer enters its HTTP layer as its own response events. Where
  inprocess.py cannot be installed, the address is a real loopback endpoint served here (`_handle`,
  HTTP/1.1 chunked encoding): the hop's cost then overlaps the backend's time to first token.

The loopback endpoint's only client is mitmproxy in this same process, so it speaks just enough HTTP/1.1
for that. The figures that chose this design are in docs/benchmarks-history.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from polarproxy.capture import inprocess
from polarproxy.capture.call_run import Sink
from polarproxy.capture.gateway import STOPPING, PendingCall

log = logging.getLogger("polarproxy.responder")

PATH_PREFIX = "/_polarproxy/call/"
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    499: "Client Closed Request",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


class ChunkedSink(Sink):
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._w = writer
        self._chunked = False
        self.ended = False

    async def head(self, status: int, headers: dict[str, str]) -> None:
        self.head_nowait(status, headers)

    def head_nowait(self, status: int, headers: dict[str, str]) -> None:
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
        self._chunked = "content-length" not in headers
        for k, v in headers.items():
            lines.append(f"{k}: {v}")
        if self._chunked:
            lines.append("transfer-encoding: chunked")
        self._w.write(("\r\n".join(lines) + "\r\n\r\n").encode())

    def end_nowait(self) -> None:
        if self._chunked:
            self._w.write(b"0\r\n\r\n")
        self.ended = True

    async def drain(self) -> None:
        await self._w.drain()

    def send_nowait(self, data: bytes) -> None:
        if not data:
            return  # an empty chunk would end a chunked body
        if self._w.is_closing():
            raise ConnectionResetError("the proxy closed the connection")
        if self._chunked:
            self._w.write(b"%x\r\n%s\r\n" % (len(data), data))
        else:
            self._w.write(data)

    async def send(self, data: bytes) -> None:
        if data:
            self.send_nowait(data)
            await self._w.drain()

    async def end(self) -> None:
        self.end_nowait()
        await self._w.drain()


class Target(Sink, Protocol):
    """Where a parked stream goes once mitmproxy asks for it: this responder's connection (`ChunkedSink`)
    or mitmproxy's HTTP layer in process (`inprocess.LayerSink`)."""

    ended: bool

    def head_nowait(self, status: int, headers: dict[str, str]) -> None: ...

    def end_nowait(self) -> None: ...

    async def drain(self) -> None: ...

    def prepare_head(self, status: int, headers: dict[str, str]) -> None: ...


class HandoffSink(Sink):
    """A streamed answer begun before mitmproxy's connection to the responder is there: buffered until
    `attach`, then passed straight to that connection."""

    def __init__(self) -> None:
        self._target: Target | None = None
        self._head: tuple[int, dict[str, str]] | None = None
        self._prepared: tuple[int, dict[str, str]] | None = None
        self._data: list[bytes] = []
        self._end = False

    @property
    def ended(self) -> bool:
        return self._target.ended if self._target is not None else False

    def prepare_head(self, status: int, headers: dict[str, str]) -> None:
        if self._target is not None:
            self._target.prepare_head(status, headers)
        else:
            self._prepared = (status, headers)

    async def head(self, status: int, headers: dict[str, str]) -> None:
        if self._target is not None:
            await self._target.head(status, headers)
        else:
            self._head = (status, headers)

    def send_nowait(self, data: bytes) -> None:
        if self._target is not None:
            self._target.send_nowait(data)
        elif data:
            self._data.append(data)

    async def send(self, data: bytes) -> None:
        if self._target is not None:
            await self._target.send(data)
        elif data:
            self._data.append(data)

    async def end(self) -> None:
        if self._target is not None:
            await self._target.end()
        else:
            self._end = True

    def attach_nowait(self, target: Target) -> None:
        """Hand what was buffered to `target` (without yielding, so nothing can come between) and pass
        everything after it straight through; the caller sees that `target` drains."""
        if self._head is not None:
            target.head_nowait(*self._head)
            for data in self._data:
                target.send_nowait(data)
            if self._end:
                target.end_nowait()
        elif self._prepared is not None:
            target.prepare_head(*self._prepared)
        self._head, self._prepared, self._data = None, None, []
        self._target = target

    async def attach(self, target: Target) -> None:
        self.attach_nowait(target)
        await target.drain()


@dataclass(slots=True)
class _Parked:
    call: PendingCall
    sink: HandoffSink
    task: asyncio.Task[None]


@dataclass
class BufferSink(Sink):
    """A whole answer, collected in memory (`serve_inline`)."""

    status: int = 502
    headers: dict[str, str] = field(default_factory=dict)
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False

    async def head(self, status: int, headers: dict[str, str]) -> None:
        self.status, self.headers = status, headers

    def send_nowait(self, data: bytes) -> None:
        self.body += data

    async def send(self, data: bytes) -> None:
        self.body += data

    async def end(self) -> None:
        self.ended = True


# How often an answer served in place looks whether the harness hung up (mitmproxy holds the connection's
# events while a hook runs, but marks the socket at once): first after FIRST_LOOK_S, then twice as long
# each time, up to LOOK_S.
FIRST_LOOK_S = 0.05
LOOK_S = 0.5


class Responder:
    """Serves calls as the addon hands them over. `serve_call` is the gateway's `serve`."""

    def __init__(self, serve_call: Callable[[PendingCall, Sink], Awaitable[None]]) -> None:
        self._serve_call = serve_call
        self.pending: dict[str, _Parked] = {}  # streams begun, waiting for mitmproxy's request
        self.running: dict[str, asyncio.Task[None]] = {}
        self._connections: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.port = 0
        self.connections: Mapping[str, Any] = {}  # mitmproxy's client connection handlers (inprocess.py)
        self.background: set[asyncio.Task[None]] = set()  # inprocess.py's injections nobody waits for
        self.held: dict[str, inprocess.HeldHead] = {}  # heads given to mitmproxy ahead, by parked path
        self.in_process = False  # streams go to mitmproxy's HTTP layer in process, not over the hop
        self._address = ("127.0.0.1", 0)

    async def start(self, host: str = "127.0.0.1", *, connections: Mapping[str, Any] | None = None) -> int:
        """Listen on a loopback port (the address flows are pointed at); with `connections` (mitmproxy's
        Proxyserver.connections) and where inprocess.py can serve it, streams skip the hop."""
        self._server = await asyncio.start_server(self._handle, host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        if connections is not None and inprocess.install():
            self.connections = connections
            self._address = (host, self.port)
            inprocess.register(self._address, self)
            self.in_process = True
        return self.port

    def _take(self, path: str) -> _Parked | None:
        """The stream parked under `path` (what mitmproxy requests for it), no longer parked; None if none."""
        if not path.startswith(PATH_PREFIX):
            return None
        return self.pending.pop(path.removeprefix(PATH_PREFIX), None)

    def claim(self, path: str, sink: inprocess.LayerSink) -> bool:
        """inprocess.Endpoint: mitmproxy asks for the stream parked under `path`, in process."""
        parked = self._take(path)
        if parked is None:
            return False
        parked.sink.attach_nowait(sink)
        sink.flush_soon()

        def ended(task: asyncio.Task[None]) -> None:
            if not sink.ended:  # cancelled (the harness went away) or failed: nothing more will come
                if not task.cancelled() and task.exception() is not None:
                    log.error("serving call %s failed", parked.call.flow_id, exc_info=task.exception())
                sink.fail("polarproxy stopped serving this answer before its end")

        parked.task.add_done_callback(ended)
        return True

    async def hold_head(self, path: str, response: Any, client_gone: Callable[[], bool]) -> Any:
        """For mitmproxy's `responseheaders` hook of the stream requested at `path`, whose `response` it
        holds: the response to send. When that head was given ahead (inprocess.HeldHead), wait until the
        answer's head is known: `inprocess.NO_HEAD` when the answer ended without one, None when the
        harness hung up first (looked at as `serve_inline` does; the flow is then killed, and the call
        recorded as aborted)."""
        held = self.held.pop(path, None)
        if held is None:
            return response
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None

        def look(wait: float) -> None:
            nonlocal timer
            if held.decided.done():
                return
            if client_gone():
                held.give(None)
                return
            timer = loop.call_later(wait, look, min(2 * wait, LOOK_S))

        look(FIRST_LOOK_S)
        try:
            return await held.decided  # one wake-up when the head is given (inprocess.LayerSink.drain)
        finally:
            if timer is not None:
                timer.cancel()

    async def stop(self) -> None:
        if self.in_process:
            inprocess.unregister(self._address)
            self.in_process = False
        for task in list(self.running.values()):
            task.cancel(STOPPING)  # recorded as stopped by the proxy, not as a hang-up
        if self.running:
            await asyncio.gather(*self.running.values(), return_exceptions=True)
        await asyncio.sleep(0)  # the cancelled streams' ends, scheduled by their tasks' callbacks
        if self.background:
            await asyncio.wait(list(self.background), timeout=5)
        self.pending.clear()
        for held in self.held.values():  # their streams' tasks ended above: nothing more will come
            held.give(inprocess.NO_HEAD)
        self.held.clear()
        if self._server is not None:
            self._server.close()
            for w in list(self._connections):  # idle keep-alive connections would hold wait_closed() forever
                w.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    def _begin(self, call: PendingCall, sink: Sink) -> asyncio.Task[None]:
        task = asyncio.ensure_future(self._serve_call(call, sink))
        if not task.done():  # an eager task factory may have run it to the end already
            self.running[call.flow_id] = task
            task.add_done_callback(lambda _t: self.running.pop(call.flow_id, None))
        return task

    async def serve_inline(self, call: PendingCall, client_gone: Callable[[], bool]) -> BufferSink | None:
        """Serve `call` into a buffer; None when the harness hung up first (the gateway recorded the call
        as aborted), the proxy is stopping, or serving failed (logged): the addon then closes the
        connection rather than letting the flow go on to the reverse target."""
        sink = BufferSink()
        task = self._begin(call, sink)
        wait = FIRST_LOOK_S
        try:
            while not task.done():
                await asyncio.wait((task,), timeout=wait)
                if not task.done() and client_gone():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    return None
                wait = min(2 * wait, LOOK_S)
        except asyncio.CancelledError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise
        if task.cancelled():
            return None
        if task.exception() is not None:  # the gateway answers its own failures; this is a bug
            log.error("serving call %s failed", call.flow_id, exc_info=task.exception())
            return None
        return sink

    def serve_stream(self, call: PendingCall) -> str:
        """Begin serving `call` into a handoff buffer; returns the path mitmproxy should request."""
        sink = HandoffSink()
        self.pending[call.flow_id] = _Parked(call, sink, self._begin(call, sink))
        return PATH_PREFIX + call.flow_id

    def abort(self, flow_id: str) -> None:
        """The harness went away: stop serving this call (the gateway records it as aborted)."""
        self.pending.pop(flow_id, None)
        task = self.running.get(flow_id)
        if task is not None:
            task.cancel()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                parts = lines[0].split(" ")
                path = parts[1] if len(parts) > 1 else ""
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip() or 0)
                if length:
                    await reader.readexactly(length)
                parked = self._take(path)
                target = ChunkedSink(writer)
                if parked is None:
                    await target.head(404, {"content-length": "0"})
                    await target.end()
                    continue
                await parked.sink.attach(target)
                try:
                    # `abort` cancels the task; awaiting it then ends this connection too (a cancelled
                    # answer cannot be followed by another on it)
                    await parked.task
                except asyncio.CancelledError:
                    return
                except Exception:
                    log.exception("serving call %s failed", parked.call.flow_id)
                    return
                if not target.ended:
                    return
        except asyncio.CancelledError:
            return
        except (ConnectionError, OSError):
            return
        finally:
            self._connections.discard(writer)
            writer.close()
