"""The loopback endpoint mitmproxy forwards gateway calls to, so that answers can be streamed.

mitmproxy sends an addon-made response in one piece, but streams what a server sends. So the addon
parses a harness request, parks it as a `PendingCall` and points the flow here; this server picks it up
by flow ID and lets the gateway write the answer chunk by chunk (HTTP/1.1 chunked encoding). Its only
client is mitmproxy in this same process, so it speaks just enough HTTP/1.1 for that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from polarproxy.capture.gateway import PendingCall, Sink

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
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
        self._chunked = "content-length" not in headers
        for k, v in headers.items():
            lines.append(f"{k}: {v}")
        if self._chunked:
            lines.append("transfer-encoding: chunked")
        self._w.write(("\r\n".join(lines) + "\r\n\r\n").encode())

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
        if self._chunked:
            self._w.write(b"0\r\n\r\n")
        await self._w.drain()
        self.ended = True


class Responder:
    """Serves parked calls. `serve_call` is the gateway's `serve`."""

    def __init__(self, serve_call: Callable[[PendingCall, Sink], Awaitable[None]]) -> None:
        self._serve_call = serve_call
        self.pending: dict[str, PendingCall] = {}
        self.running: dict[str, asyncio.Task[None]] = {}
        self._connections: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self, host: str = "127.0.0.1") -> int:
        self._server = await asyncio.start_server(self._handle, host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        for task in list(self.running.values()):
            task.cancel()
        if self.running:
            await asyncio.gather(*self.running.values(), return_exceptions=True)
        if self._server is not None:
            self._server.close()
            for w in list(self._connections):  # idle keep-alive connections would hold wait_closed() forever
                w.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    def park(self, call: PendingCall) -> str:
        self.pending[call.flow_id] = call
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
                flow_id = path.removeprefix(PATH_PREFIX)
                call = self.pending.pop(flow_id, None) if path.startswith(PATH_PREFIX) else None
                sink = ChunkedSink(writer)
                if call is None:
                    await sink.head(404, {"content-length": "0"})
                    await sink.end()
                    continue
                # Served inline on this connection's task: `abort` cancels it, which also ends the
                # connection (a cancelled answer cannot be followed by another on it).
                task = asyncio.current_task()
                assert task is not None
                self.running[flow_id] = task
                try:
                    await self._serve_call(call, sink)
                except Exception:
                    log.exception("serving call %s failed", flow_id)
                    return
                finally:
                    self.running.pop(flow_id, None)
                if not sink.ended:
                    return
        except asyncio.CancelledError:
            return
        finally:
            self._connections.discard(writer)
            writer.close()
