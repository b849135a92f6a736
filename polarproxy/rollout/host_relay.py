"""The host end of an episode's bridge: a Unix socket whose requests reach the gateway only with that
episode's own key.

Each episode has a socket of its own (stages.py `episode_bridge`), bound into its sandbox alone. The relay
reads every request's head before anything reaches the gateway and forwards it only when every key it
carries (`Authorization: Bearer`, store/keys.py's `KEY_HEADERS`, `?key=`: where the gateway reads
them) is this episode's key, compared in constant time: a key taken from another episode is useless from
this sandbox, and a request with none is refused here too. A refusal is a 403 in the shape of the dialect
the path names (an OpenAI-shaped body for other paths), the connection ends, and the refusal is counted by
its code (`rollout --json`'s `bridge_refused` per episode: it never reaches the gateway or the store).

One request per connection: the relay sends `Connection: close` to the gateway and reads nothing more from
the client, so no second request (pipelined, or smuggled behind a chunked body) passes unchecked. A body is
framed by `Content-Length` or by chunks; both at once, several lengths, another transfer coding, an HTTP
version other than 1.0/1.1, folded or oversized heads, and protocol upgrades (the gateway serves none) are
refused (400/431).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import socket
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

from polarproxy.rollout.bridge import BUFFER
from polarproxy.store.keys import KEY_HEADERS

MAX_HEAD_BYTES = 64 * 1024
HEAD_TIMEOUT_S = 60.0  # a client that opens a connection and sends no head in this time is dropped
BODY_IDLE_S = 300.0  # a body that stops arriving for this long is dropped
HOP_HEADERS = {"connection", "keep-alive", "proxy-connection"}


class BridgeRefusal(Exception):
    """A request the relay does not forward: its status, message and error code."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class _Reader:
    """Buffered reads from one side of a connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def fill(self) -> bool:
        data = self.sock.recv(BUFFER)
        self.buf += data
        return bool(data)

    def head(self) -> bytes | None:
        """A message head (up to and without its blank line); None when the peer left first."""
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            if len(self.buf) > MAX_HEAD_BYTES:
                raise BridgeRefusal(431, f"the request head is over {MAX_HEAD_BYTES} bytes", "head_too_large")
            if not self.fill():
                return None
        if end > MAX_HEAD_BYTES:
            raise BridgeRefusal(431, f"the request head is over {MAX_HEAD_BYTES} bytes", "head_too_large")
        head, self.buf = self.buf[:end], self.buf[end + 4 :]
        return head

    def line(self) -> bytes:
        """One CRLF-ended line, CRLF included."""
        while (end := self.buf.find(b"\r\n")) < 0:
            if len(self.buf) > MAX_HEAD_BYTES:
                raise BridgeRefusal(400, "a chunk line is too long", "bad_chunk")
            if not self.fill():
                raise BridgeRefusal(400, "the body ended inside a chunk", "bad_chunk")
        out, self.buf = self.buf[: end + 2], self.buf[end + 2 :]
        return out

    def copy(self, n: int, dst: socket.socket) -> None:
        """Send the next n bytes to dst as they arrive (a stream stays a stream)."""
        while n > 0:
            if not self.buf and not self.fill():
                raise BridgeRefusal(400, "the body ended early", "short_body")
            piece, self.buf = self.buf[:n], self.buf[n:]
            dst.sendall(piece)
            n -= len(piece)

    def copy_to_end(self, dst: socket.socket) -> None:
        if self.buf:
            dst.sendall(self.buf)
            self.buf = b""
        while self.fill():
            dst.sendall(self.buf)
            self.buf = b""

    def copy_body(self, dst: socket.socket, length: int | None, chunked: bool) -> None:
        """Send one message body to dst, framed by `length` or by chunks."""
        if not chunked:
            self.copy(length or 0, dst)
            return
        while True:
            line = self.line()
            size_text = line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise BridgeRefusal(
                    400, f"a chunk size {size_text[:20]!r} is not hexadecimal", "bad_chunk"
                ) from None
            dst.sendall(line)
            if size == 0:
                while (trailer := self.line()) != b"\r\n":
                    dst.sendall(trailer)
                dst.sendall(b"\r\n")
                return
            self.copy(size, dst)
            if self.line() != b"\r\n":
                raise BridgeRefusal(400, "a chunk is longer than its size", "bad_chunk")
            dst.sendall(b"\r\n")


def _headers(lines: list[str]) -> list[tuple[str, str]]:
    headers = []
    for raw in lines:
        if raw[:1] in (" ", "\t") or ":" not in raw:
            raise BridgeRefusal(400, f"a malformed header line: {raw[:80]!r}", "bad_request")
        name, _, value = raw.partition(":")
        if name != name.strip() or not name:
            raise BridgeRefusal(400, f"a malformed header name: {name[:80]!r}", "bad_request")
        headers.append((name.lower(), value.strip()))
    return headers


def _parse_head(head: bytes) -> tuple[str, str, str, list[tuple[str, str]]]:
    line, *rest = head.decode("latin-1").split("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or parts[2] not in ("HTTP/1.1", "HTTP/1.0") or not parts[0].isalpha():
        raise BridgeRefusal(400, f"not an HTTP/1.1 request line: {line[:80]!r}", "bad_request")
    return parts[0], parts[1], parts[2], _headers(rest)


def presented_keys(target: str, headers: list[tuple[str, str]]) -> list[str]:
    """Every API key a request carries, in each place an SDK puts one."""
    found = []
    for name, value in headers:
        if name == "authorization":
            scheme, _, rest = value.partition(" ")
            found.append(rest.strip() if scheme.lower() == "bearer" else value)
        elif name in KEY_HEADERS:  # store/keys.py: where the gateway reads keys too
            found.append(value)
    found += [v for k, v in parse_qsl(urlsplit(target).query, keep_blank_values=True) if k == "key"]
    return found


def _error_body(method: str, path: str, status: int, message: str, code: str) -> bytes:
    from polarproxy.dialects import route

    dialect = route(method, path)
    if dialect is not None:
        return dialect.error(status, message, code)
    return json.dumps({"error": {"message": message, "type": "permission_error", "code": code}}).encode()


def _refuse(conn: socket.socket, method: str, path: str, refused: BridgeRefusal) -> None:
    body = _error_body(method, path, refused.status, f"polarproxy bridge: {refused.message}", refused.code)
    reason = {400: "Bad Request", 403: "Forbidden", 431: "Request Header Fields Too Large"}
    head = (
        f"HTTP/1.1 {refused.status} {reason.get(refused.status, 'Error')}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    with contextlib.suppress(OSError):
        conn.sendall(head.encode() + body)


def _framing(headers: list[tuple[str, str]]) -> tuple[int | None, bool]:
    """(content length, chunked): how the body ends; refused when ambiguous."""
    lengths = {v for n, v in headers if n == "content-length"}
    codings = [v.lower() for n, v in headers if n == "transfer-encoding"]
    if codings and lengths:
        raise BridgeRefusal(400, "both Content-Length and Transfer-Encoding", "bad_framing")
    if codings:
        if codings != ["chunked"]:
            raise BridgeRefusal(
                400, f"transfer coding {', '.join(codings)!r} (only 'chunked')", "bad_framing"
            )
        return None, True
    if len(lengths) > 1:
        raise BridgeRefusal(400, f"several Content-Length values: {sorted(lengths)}", "bad_framing")
    if lengths:
        (text,) = lengths
        if not text.isdigit():
            raise BridgeRefusal(400, f"Content-Length {text[:40]!r} is not a number", "bad_framing")
        return int(text), False
    return 0, False


def _relay_answer(upstream: _Reader, conn: socket.socket, method: str) -> None:
    """Send the gateway's answer to one request on to the client, interim answers included, and stop at
    its end (the gateway may keep the connection open after a streamed answer)."""
    while (head := upstream.head()) is not None:
        conn.sendall(head + b"\r\n\r\n")
        line, *rest = head.decode("latin-1").split("\r\n")
        status = int(line.split(" ", 2)[1])
        if 100 <= status < 200:
            continue
        if method == "HEAD" or status in (204, 304):
            return
        headers = _headers(rest)
        if any(n == "transfer-encoding" for n, _ in headers) or any(
            n == "content-length" for n, _ in headers
        ):
            upstream.copy_body(conn, *_framing(headers))
        else:
            upstream.copy_to_end(conn)
        return


def _watch_client(conn: socket.socket, upstream: socket.socket) -> None:
    """Read (and drop: never forwarded) what the client sends after its request; when it closes, close
    the gateway's side for writing too, so the gateway sees the client leave as it would directly."""
    try:
        while conn.recv(BUFFER):
            pass
    except OSError:
        pass
    with contextlib.suppress(OSError):
        upstream.shutdown(socket.SHUT_WR)


def handle(
    conn: socket.socket, dial: Callable[[], socket.socket], key: str, refused: Counter[str] | None = None
) -> None:
    """One client connection: check its first request's keys, forward it alone, relay the answer."""
    client = _Reader(conn)
    method, path = "POST", "/"
    upstream: socket.socket | None = None
    try:
        conn.settimeout(HEAD_TIMEOUT_S)
        head = client.head()
        if head is None:
            return
        method, target, version, headers = _parse_head(head)
        path = urlsplit(target).path
        keys = presented_keys(target, headers)
        if not keys:
            raise BridgeRefusal(
                403, "the request carries no API key; send this episode's key", "episode_key_required"
            )
        if not all(hmac.compare_digest(k.encode(), key.encode()) for k in keys):
            raise BridgeRefusal(
                403, "the request carries a key that is not this episode's", "episode_key_mismatch"
            )
        length, chunked = _framing(headers)
        if any(n == "upgrade" for n, _ in headers):
            raise BridgeRefusal(
                400, "a protocol upgrade (the gateway serves HTTP/1.1 only)", "upgrade_not_served"
            )
        kept = [(n, v) for n, v in headers if n not in HOP_HEADERS]
        kept.append(("connection", "close"))
        out = f"{method} {target} {version}\r\n" + "".join(f"{n}: {v}\r\n" for n, v in kept) + "\r\n"
        conn.settimeout(BODY_IDLE_S)
        upstream = dial()
        upstream.sendall(out.encode("latin-1"))
        client.copy_body(upstream, length, chunked)
        conn.settimeout(None)
        threading.Thread(target=_watch_client, args=(conn, upstream), daemon=True).start()
        _relay_answer(_Reader(upstream), conn, method)
    except BridgeRefusal as refusal:
        if refused is not None:
            refused[refusal.code] += 1
        if upstream is None:
            _refuse(conn, method, path, refusal)
    except OSError:
        pass
    finally:
        for s in (upstream, conn):
            if s is not None:  # shutdown first: it wakes the watcher's recv and sends the end at once
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()


class HostRelay:
    """On the host: a Unix socket at `path` whose requests go to 127.0.0.1:`port` (the gateway) when they
    carry `key`, this episode's key (the module's docstring says how)."""

    def __init__(self, path: Path, port: int, key: str, host: str = "127.0.0.1") -> None:
        self.path, self.port, self.host, self.key = path, port, host, key
        self.refused: Counter[str] = Counter()  # requests refused here, by error code (rollout's summary)
        self._stop = threading.Event()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._sock.bind(str(path))
        os.chmod(path, 0o666)
        self._sock.listen(256)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _dial(self) -> socket.socket:
        return socket.create_connection((self.host, self.port))

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(
                target=handle, args=(conn, self._dial, self.key, self.refused), daemon=True
            ).start()

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(5)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
