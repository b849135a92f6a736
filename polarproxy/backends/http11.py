"""A small asyncio HTTP/1.1 client for the backend leg, with a keep-alive pool.

The proxy talks to one backend over loopback or a datacenter network, many times a second. httpx's pool
costs about a third of the proxy's CPU per call (it re-checks every idle connection on each request and
release), so this client does the little that leg needs: one host, keep-alive, `Content-Length`, chunked
and close-delimited bodies, streaming reads, connect and read timeouts, and one retry when a reused idle
connection turns out to have been closed by the server before it answered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class HTTPError(Exception):
    """The exchange failed. `connect` is true when no connection could be made at all."""

    def __init__(self, message: str, *, connect: bool = False) -> None:
        super().__init__(message)
        self.connect = connect


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class Response:
    """Status and headers are read; the body is read with `read()` or `iter_chunks()`, then `close()`."""

    def __init__(self, client: HTTPClient, conn: _Conn, status: int, headers: dict[str, str]) -> None:
        self._client = client
        self._conn: _Conn | None = conn
        self.status = status
        self.headers = headers
        te = headers.get("transfer-encoding", "").lower()
        self._chunked = "chunked" in te
        length = headers.get("content-length")
        self._remaining = int(length) if length is not None and not self._chunked else None
        self._keep = headers.get("connection", "").lower() != "close" and (
            self._chunked or self._remaining is not None
        )
        self._done = False
        self._idle: _Idle | None = None

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        conn = self._conn
        assert conn is not None
        reader, timeout = conn.reader, self._client.read_timeout
        # one timer for the whole body (not one per read), ended when the body is or at close()
        idle = self._idle = self._idle or _Idle(conn, timeout)
        try:
            if self._chunked:
                while True:
                    line = await reader.readuntil(b"\r\n")
                    size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                    if size == 0:
                        while (await reader.readuntil(b"\r\n")) != b"\r\n":
                            pass  # trailers
                        break
                    data = await reader.readexactly(size + 2)
                    idle.touch()
                    yield data[:-2]
            elif self._remaining is not None:
                while self._remaining > 0:
                    data = await reader.read(min(self._remaining, 65536))
                    if not data:
                        raise HTTPError("the backend closed the connection before the end of the body")
                    idle.touch()
                    self._remaining -= len(data)
                    yield data
            else:
                while data := await reader.read(65536):
                    idle.touch()
                    yield data
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
            if idle.expired:
                raise HTTPError(f"the backend sent nothing for {timeout:.0f} s") from e
            raise HTTPError(f"the backend connection broke mid-body: {e!r}") from e
        idle.cancel()
        self._done = True

    async def finish(self, timeout: float = 1.0) -> None:
        """Read what is left of a body the server has said is complete (an SSE `[DONE]`), so that the
        connection goes back to the pool; if that takes longer than `timeout` or fails, it is closed."""
        if self._done or self._conn is None or not self._keep:
            return
        with contextlib.suppress(HTTPError, TimeoutError):
            async with asyncio.timeout(timeout):
                async for _ in self.iter_chunks():
                    pass

    async def read(self) -> bytes:
        return b"".join([c async for c in self.iter_chunks()])

    async def close(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._keep:
            self._client._release(conn)
        else:
            conn.close()


class HTTPClient:
    def __init__(
        self, base_url: str, *, connect_timeout: float = 5.0, read_timeout: float = 600.0, max_idle: int = 64
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"Backend URL {base_url!r} must look like http://HOST:PORT.")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = parts.scheme == "https"
        self.prefix = parts.path.rstrip("/")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: list[_Conn] = []
        self._max_idle = max_idle
        self._host_header = f"{self.host}:{self.port}".encode()

    async def _connect(self) -> _Conn:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self.ssl or None, limit=2**20),
                self.connect_timeout,
            )
        except (OSError, TimeoutError) as e:
            raise HTTPError(f"cannot connect to {self.host}:{self.port}: {e}", connect=True) from e
        return _Conn(reader, writer)

    def _release(self, conn: _Conn) -> None:
        if len(self._idle) < self._max_idle and not conn.writer.is_closing():
            self._idle.append(conn)
        else:
            conn.close()

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> Response:
        head = [
            b"%s %s HTTP/1.1" % (method.encode(), (self.prefix + path).encode()),
            b"host: " + self._host_header,
            b"content-length: %d" % len(body),
        ]
        for k, v in (headers or {}).items():
            head.append(f"{k}: {v}".encode())
        payload = b"\r\n".join(head) + b"\r\n\r\n" + body
        while self._idle:
            conn = self._idle.pop()
            try:
                return await self._exchange(conn, payload)
            except _Stale:
                conn.close()  # closed by the server while idle: try the next one
        return await self._exchange(await self._connect(), payload, fresh=True)

    async def _exchange(self, conn: _Conn, payload: bytes, *, fresh: bool = False) -> Response:
        try:
            conn.writer.write(payload)
            await conn.writer.drain()
            status_line = await asyncio.wait_for(conn.reader.readuntil(b"\r\n"), self.read_timeout)
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
            conn.close()
            if not fresh:
                raise _Stale() from e
            raise HTTPError(f"the backend closed the connection before answering: {e!r}") from e
        except TimeoutError as e:
            conn.close()
            raise HTTPError(f"the backend did not answer within {self.read_timeout:.0f} s") from e
        try:
            parts = status_line.split(b" ", 2)
            status = int(parts[1])
            raw = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), self.read_timeout)
        except (
            ValueError,
            IndexError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            OSError,
            TimeoutError,
        ) as e:
            conn.close()
            raise HTTPError(f"the backend sent a malformed response head: {status_line[:100]!r}") from e
        headers: dict[str, str] = {}
        for line in raw.decode("latin-1").split("\r\n"):
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        return Response(self, conn, status, headers)

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().close()


class _Idle:
    """Aborts a connection that has read nothing for `timeout` seconds (the read then fails, and
    `expired` says why). Reads only note the time; the timer re-arms itself when it finds they did."""

    __slots__ = ("_conn", "_handle", "_last", "_loop", "_timeout", "expired")

    def __init__(self, conn: _Conn, timeout: float) -> None:
        self._conn, self._timeout, self.expired = conn, timeout, False
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._handle = self._loop.call_at(self._last + timeout, self._check)

    def touch(self) -> None:
        self._last = self._loop.time()

    def _check(self) -> None:
        due = self._last + self._timeout
        if self._loop.time() < due:
            self._handle = self._loop.call_at(due, self._check)
            return
        self.expired = True
        self._conn.writer.transport.abort()

    def cancel(self) -> None:
        self._handle.cancel()


class _Stale(Exception):
    """A pooled connection was closed by the server while idle."""
