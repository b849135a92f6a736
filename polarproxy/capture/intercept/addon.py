"""The intercept addon: record provider calls as they pass through a forward proxy, change nothing.

For a request to a provider endpoint (see `providers.py`) it writes an in-flight call while the request
travels upstream and waits for that write before the first byte of the answer goes back; it tees the
response through `ResponseTap` while mitmproxy streams it to the client, and finishes the call in the
`response` hook, which mitmproxy runs before it ends a chunked or HTTP/2 body, so the record is on disk
before the harness sees the end of the answer (T6). A write that fails cuts the call off (DESIGN §9). Provider errors, bodies
that are not the provider's format, streams cut short and clients that refuse the CA are recorded as
failed (or aborted) calls with the reason; the traffic itself is never altered.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

import orjson
from mitmproxy import http
from mitmproxy.proxy.server_hooks import ServerConnectionHookData
from mitmproxy.tls import TlsData

from polarproxy.capture.intercept.providers import Providers
from polarproxy.capture.intercept.tap import ResponseTap
from polarproxy.capture.intercept.websocket import SocketRecorder
from polarproxy.dialects import DialectError
from polarproxy.dialects.replies import Reply, reply_parser
from polarproxy.redact import redact_headers, redact_path
from polarproxy.store.records import CallResult, CallStart
from polarproxy.store.writer import StoreWriter

log = logging.getLogger("polarproxy.intercept")

META_KEY = "polarproxy.intercept"


@dataclass(slots=True)
class _Flow:
    begun: asyncio.Future[tuple[str, int]]  # begin_call: (call_id, seq)
    start: CallStart
    turns: int
    request_problem: str | None
    tap: ResponseTap | None = None


def _error_message(body: bytes) -> str:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:200].decode("utf-8", "replace").strip()
    if isinstance(data, list) and data:
        data = data[0]
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err or data)[:200]


_HOST_HEADER = re.compile(r"(\[[^\]]+\]|[^:\[\]]+)(?::(\d{1,5}))?")


def _authority(req: http.Request) -> tuple[str, int]:
    """The host and port the client asked for (its Host header), not where `--resolve` sent the connection."""
    m = _HOST_HEADER.fullmatch(req.host_header or "")
    if m is None:
        return req.pretty_host.lower(), req.port
    port = int(m.group(2)) if m.group(2) else (443 if req.scheme == "https" else 80)
    return m.group(1).strip("[]").lower(), port


class Interceptor:
    """mitmproxy addon for `record --intercept`. `resolve` maps host names to (ip, port) to dial instead."""

    def __init__(
        self,
        *,
        writer: StoreWriter,
        episode_id: str,
        providers: Providers,
        resolve: Mapping[str, tuple[str, int]] | None = None,
    ) -> None:
        self.writer = writer
        self.episode_id = episode_id
        self.providers = providers
        self.resolve = {h.lower(): a for h, a in (resolve or {}).items()}
        self._warned_ws: set[str] = set()
        self.sockets = SocketRecorder(self)

    # -- connections ----------------------------------------------------------------------------

    def server_connect(self, data: ServerConnectionHookData) -> None:
        if data.server.address is None:
            return
        host, port = data.server.address[:2]
        target = self.resolve.get(f"{host}:{port}".lower()) or self.resolve.get(str(host).lower())
        if target is not None:
            if data.server.sni is None:
                data.server.sni = str(host)  # verify the upstream certificate against the real name
            data.server.address = target

    async def tls_failed_client(self, data: TlsData) -> None:
        """A client that refused our certificate: its request never arrives, so record why."""
        sni = data.context.client.sni
        if not sni or not self.providers.intercepts(sni):
            return
        reason = data.conn.error or "TLS handshake failed"
        await self._failed_before_request(
            sni,
            f"the client rejected polarproxy's certificate for {sni} ({reason}): it does not trust "
            "the intercept CA (see `polarproxy ca install-hint`)",
        )

    async def server_connect_error(self, data: ServerConnectionHookData) -> None:
        """A provider that cannot be reached: the CONNECT fails before any request, so say and record why."""
        host = data.server.sni or (str(data.server.address[0]) if data.server.address else "")
        if not host or not self.providers.intercepts(host):
            return
        reason = data.server.error or "connection failed"
        print(f"polarproxy: cannot reach {host}: {reason} (recorded as a failed call)", file=sys.stderr)
        await self._failed_before_request(host, f"cannot reach the provider {host}: {reason}")

    async def _failed_before_request(self, host: str, error: str) -> None:
        """Record a call that failed before its request was seen (a refused certificate, no upstream)."""
        start = CallStart(
            episode_id=self.episode_id,
            dialect=self.providers.dialect_for_host(host),
            method="CONNECT",
            path="",
            model="",
            stream=False,
            request_headers={},
            request_body="",
            conversation=None,
            prompt_ids=[],
            backend=f"https://{host}",
            backend_kind="provider",
            fidelity="text",
            started_at=time.time(),
        )
        call_id, _ = await self.writer.begin_call(start)
        await self.writer.finish_call(call_id, CallResult(status="failed", error=error, ended_at=time.time()))

    def websocket_start(self, flow: http.HTTPFlow) -> None:
        """A Responses WebSocket to a provider is recorded (websocket.py); any other WebSocket to an
        intercepted host passes through unrecorded: say so once per host."""
        host, port = _authority(flow.request)
        if SocketRecorder.records(self, host, port, flow.request.path):
            self.sockets.start(flow, host, port)
        elif self.providers.intercepts(host, port) and host not in self._warned_ws:
            self._warned_ws.add(host)
            log.warning(
                "polarproxy: a WebSocket to %s%s passes through unrecorded (only the Responses API's "
                "WebSocket and HTTPS requests are recorded)",
                host,
                redact_path(flow.request.path),
            )

    async def websocket_message(self, flow: http.HTTPFlow) -> None:
        await self.sockets.message(flow)

    async def websocket_end(self, flow: http.HTTPFlow) -> None:
        await self.sockets.end(flow)

    # -- flows ----------------------------------------------------------------------------------

    async def request(self, flow: http.HTTPFlow) -> None:
        req = flow.request
        bare = req.path.partition("?")[0]
        host, port = _authority(req)
        dialect = self.providers.match(host, port, req.method, bare)
        if dialect is None:
            return
        problem = None
        conv = None
        turns = 0
        try:
            body = orjson.loads(req.content or b"")
        except orjson.JSONDecodeError as e:
            problem = f"the request body is not JSON ({e})"
        else:
            if isinstance(body, dict) and isinstance(body.get("contents"), list):
                turns = len(body["contents"])
            try:
                conv = dialect.parse(body, path=bare, query=dict(req.query))
            except DialectError as e:
                problem = f"the request did not parse as {dialect.name}: {e.message}"
        start = CallStart(
            episode_id=self.episode_id,
            dialect=dialect.name,
            method=req.method,
            path=redact_path(req.path),
            model=conv.model if conv else "",
            stream=conv.stream if conv else False,
            request_headers=redact_headers(req.headers.items(multi=True)),
            request_body=req.get_text(strict=False) or "",
            conversation=conv.to_dict() if conv else None,
            prompt_ids=[],
            backend=f"{req.scheme}://{host}" + ("" if port in (80, 443) else f":{port}"),
            backend_kind="provider",
            fidelity="text",
            started_at=req.timestamp_end or time.time(),
        )
        # The in-flight row is written while the request travels upstream (not before: that would add a
        # commit to every call's latency); `responseheaders` waits for it before the first byte goes back.
        begun = asyncio.ensure_future(self.writer.begin_call(start))
        flow.metadata[META_KEY] = _Flow(begun=begun, start=start, turns=turns, request_problem=problem)

    async def responseheaders(self, flow: http.HTTPFlow) -> None:
        rec: _Flow | None = flow.metadata.get(META_KEY)
        if rec is None or flow.response is None:
            return
        try:
            await rec.begun  # T6: the call is on disk before the first byte of its answer reaches the client
        except Exception as e:
            # DESIGN §9: fail visibly rather than let a call through unrecorded
            log.error(
                "polarproxy cannot record %s %s (%s); the call is cut off",
                flow.request.method,
                flow.request.pretty_host + redact_path(flow.request.path),
                e,
            )
            flow.metadata.pop(META_KEY, None)
            flow.kill()
            return
        rec.tap = ResponseTap(
            reply_parser(rec.start.dialect, turns=rec.turns),
            content_type=flow.response.headers.get("content-type", ""),
            content_encoding=flow.response.headers.get("content-encoding", ""),
            started=rec.start.started_at,
        )
        flow.response.stream = rec.tap.feed  # pass through unbuffered, keep a copy

    async def response(self, flow: http.HTTPFlow) -> None:
        rec: _Flow | None = flow.metadata.pop(META_KEY, None)
        if rec is None or flow.response is None:
            return
        if rec.tap is None:  # an addon answered without streaming; read the whole body
            rec.tap = ResponseTap(
                reply_parser(rec.start.dialect, turns=rec.turns),
                content_type=flow.response.headers.get("content-type", ""),
                content_encoding="",
                started=rec.start.started_at,
            )
            rec.tap.feed(flow.response.get_content(strict=False) or b"")
        await self._finish(rec, flow.response.status_code, None)

    async def error(self, flow: http.HTTPFlow) -> None:
        rec: _Flow | None = flow.metadata.pop(META_KEY, None)
        if rec is None:
            return
        msg = flow.error.msg if flow.error else "connection error"
        status = flow.response.status_code if flow.response is not None else None
        if status is None and "client" not in msg.lower():
            where = flow.request.pretty_host + redact_path(flow.request.path)
            print(
                f"polarproxy: {flow.request.method} {where} failed: {msg} (recorded as a failed call)",
                file=sys.stderr,
            )
        await self._finish(rec, status, msg)

    async def _finish(self, rec: _Flow, status: int | None, connection_error: str | None) -> None:
        tap = rec.tap
        reply = tap.close() if tap is not None else None
        await self.finish_exchange(
            begun=rec.begun,
            started=rec.start.started_at,
            reply=reply,
            body=tap.text() if tap is not None else None,
            first_output_at=tap.first_output_at if tap is not None else None,
            status=status,
            error_detail=_error_message(bytes(tap.body)) if tap is not None else "",
            request_problem=rec.request_problem,
            read_problem=tap.problem if tap is not None else None,
            connection_error=connection_error,
            partial=tap is not None and bool(tap.body),
        )

    async def finish_exchange(
        self,
        *,
        begun: asyncio.Future[tuple[str, int]],
        started: float,
        reply: Reply | None,
        body: str | None,
        first_output_at: float | None,
        status: int | None,
        error_detail: str | None,
        request_problem: str | None,
        read_problem: str | None,
        connection_error: str | None,
        partial: bool,
    ) -> None:
        """Finish a recorded call (an HTTP request or a WebSocket exchange, websocket.py) with its outcome
        and the reasons: the request did not parse, the answer could not be read (`read_problem`), the
        connection broke, the provider answered an error. `partial`: keep what a cut-short answer held."""
        now = time.time()
        problems = [request_problem] if request_problem else []
        outcome = "ok"
        client_gone = connection_error is not None and "client" in connection_error.lower()
        if client_gone and reply is not None and reply.complete and not read_problem:
            # The client had the whole answer (its final event) and hung up before the body's terminator,
            # as SDKs that stop reading at `response.completed` / `message_stop` do: a complete call.
            connection_error = None
        if connection_error is not None:
            outcome = "aborted" if client_gone else "failed"
            problems.append(f"connection error: {connection_error}")
        if status is not None and status >= 400:
            problems.append(
                f"provider error {status}: {error_detail}" if error_detail else f"provider error {status}"
            )
        elif read_problem:
            problems.append(read_problem)
        elif reply is not None and reply.error:
            problems.append(f"the provider reported an error: {reply.error}")
        elif reply is not None and not reply.complete and connection_error is None:
            problems.append("the response ended before its final event")
        if problems and outcome == "ok":
            outcome = "failed"
        c = reply.completion if reply is not None and (reply.complete or partial) else None
        result = CallResult(
            status=outcome,  # type: ignore[arg-type]
            error="; ".join(problems) or None,
            http_status=status,
            response_body=body,
            completion=c.to_dict() if c is not None else None,
            finish_reason=c.finish_reason if c is not None and outcome == "ok" else None,
            latency_ms=(now - started) * 1000,
            ttft_ms=(first_output_at - started) * 1000 if first_output_at is not None else None,
            ended_at=now,
            prompt_tokens=c.usage.prompt_tokens if c is not None and reply and reply.usage_reported else None,
            completion_tokens=(
                c.usage.completion_tokens if c is not None and reply and reply.usage_reported else None
            ),
        )
        call_id, _ = await begun
        try:
            await self.writer.finish_call(call_id, result)
        except Exception:
            log.exception("could not record call %s", call_id)
            raise
