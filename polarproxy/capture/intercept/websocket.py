"""The Responses API over a WebSocket, recorded as calls (Codex's preferred transport for the real provider).

The protocol, as Codex speaks it (openai/codex, `codex-rs/codex-api/src/common.rs`: `ResponsesWsRequest`
is serde-tagged by `type`; `codex-rs/codex-api/src/endpoint/responses_websocket.rs`:
`run_websocket_response_stream`):

- the client opens `wss://HOST/v1/responses` and sends one text message per request,
  `{"type": "response.create", ...}` with the fields of an HTTP Responses request body (`model`,
  `instructions`, `input`, `tools`, `stream`, ...). On a socket it reuses, Codex sends
  `previous_response_id` with only the new input items. Before the first request of a turn it may send a
  warm-up, the same message with `"generate": false`, which the server answers with an empty response:
  that is not a model call and is not recorded. Newer versions also send
  `{"type": "response.processed", "response_id": ...}` after a response (not a call either);
- the server answers with one text message per Responses stream event: the JSON an HTTP stream carries in
  its `data:` lines (`response.created`, `response.output_text.delta`, ..., `response.completed`). A
  response ends with `response.completed` (or `response.failed` / `response.incomplete`), or with an error
  message `{"type": "error", "status": 429, "error": {"message": ...}}`; requests on one socket follow one
  another.

Each `response.create` and the events answering it are one call, recorded as intercept mode records an
HTTP Responses call: the request as sent (`method` WEBSOCKET), the answer's text, reasoning, tool calls and
usage, and the events as the server sent them (`response_body`, one `event:`/`data:` block per message,
the same form as an HTTP stream's body). A request that names a `previous_response_id` answered earlier
on the same socket is recorded with the whole conversation (that response's input and output items, then
the new input), as the HTTP transport would have sent it. The call is on disk before the first event of
its answer is passed to the client, and finished before its final event is (T6); a socket that closes
mid-response leaves the call failed (the server closed) or aborted (the client did) with the close code.
When the record cannot be written, the client gets an `error` event in place of the answer (DESIGN §9).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from mitmproxy import http
from wsproto.frame_protocol import Opcode

from polarproxy.dialects import DialectError, route
from polarproxy.dialects.replies import reply_parser
from polarproxy.dialects.replies.base import Reply, ReplyError, ReplyParser
from polarproxy.redact import redact_headers, redact_path
from polarproxy.store.records import CallStart

if TYPE_CHECKING:
    from polarproxy.capture.intercept.addon import Interceptor

log = logging.getLogger("polarproxy.intercept")

META_KEY = "polarproxy.intercept.websocket"
DIALECT = "openai_responses"
FINAL = ("response.completed", "response.incomplete", "response.failed")
CUT_STATUS = 502  # the status of the error event sent in place of an answer that could not be recorded


@dataclass(slots=True)
class Exchange:
    """One `response.create` and the events that answer it."""

    begun: asyncio.Future[tuple[str, int]] | None  # None: a warm-up (`generate: false`), not recorded
    start: CallStart
    request_items: list[Any]  # the whole input (after `previous_response_id` is resolved)
    request_problem: str | None
    parser: ReplyParser = field(default_factory=lambda: reply_parser(DIALECT))
    events: list[bytes] = field(default_factory=list)  # as SSE blocks
    first_output_at: float | None = None
    problem: str | None = None  # why the answer could not be read
    status: int | None = None  # the `status` of an error event
    error_detail: str | None = None
    final_response: dict[str, Any] | None = None  # the Response object of the final event
    answered: bool = False  # the first server event went past (the in-flight row was awaited)
    cut: bool = False  # the record could not be written: the answer is not passed on

    @property
    def body(self) -> str:
        return b"".join(self.events).decode("utf-8", "replace")


@dataclass(slots=True)
class Socket:
    backend: str
    path: str
    headers: dict[str, str]
    pending: deque[Exchange] = field(default_factory=deque)
    history: dict[str, list[Any]] = field(default_factory=dict)  # response id -> its input + output items


def _sse_block(kind: str | None, text: str) -> bytes:
    """A WebSocket message as an SSE event (a multi-line message becomes several `data:` lines)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    head = f"event: {kind}\n" if kind else ""
    return (head + "".join(f"data: {line}\n" for line in lines) + "\n").encode()


def _error_detail(data: dict[str, Any]) -> str:
    err = data.get("error")
    if isinstance(err, dict):
        return str(err.get("message") or err.get("code") or err)
    return str(err or data.get("message") or "")[:200]


class SocketRecorder:
    """The WebSocket half of the intercept addon (`Interceptor` passes its websocket hooks on)."""

    def __init__(self, interceptor: Interceptor) -> None:
        self.interceptor = interceptor

    @staticmethod
    def records(interceptor: Interceptor, host: str, port: int, path: str) -> bool:
        """Whether a WebSocket to host:port/path is one this recorder reads (Responses on a provider)."""
        bare = path.partition("?")[0]
        dialect = interceptor.providers.match(host, port, "POST", bare)
        return dialect is not None and dialect.name == DIALECT

    def start(self, flow: http.HTTPFlow, host: str, port: int) -> None:
        req = flow.request
        flow.metadata[META_KEY] = Socket(
            backend=f"{req.scheme}://{host}" + ("" if port in (80, 443) else f":{port}"),
            path=redact_path(req.path),
            headers=redact_headers(req.headers.items(multi=True)),
        )

    async def message(self, flow: http.HTTPFlow) -> None:
        sock: Socket | None = flow.metadata.get(META_KEY)
        if sock is None or flow.websocket is None or not flow.websocket.messages:
            return
        msg = flow.websocket.messages[-1]
        if msg.from_client:
            self._request(sock, msg.content, msg.type, msg.timestamp)
            return
        if not sock.pending:
            return  # an event outside any response (none are known): passed on, not a call
        ex = sock.pending[0]
        content, kind = msg.content, msg.type
        if ex.begun is None:  # a warm-up: its events are read only to find where its answer ends
            if self._event(ex, content, kind):
                sock.pending.popleft()
                self._remember(sock, ex)
            return
        if not ex.answered:
            ex.answered = True
            try:
                await ex.begun  # T6: the call is on disk before the first event of its answer goes on
            except Exception as e:
                ex.cut = True
                log.error(
                    "polarproxy cannot record a WebSocket call to %s (%s); it is cut off", sock.backend, e
                )
                error = {
                    "type": "error",
                    "status": CUT_STATUS,
                    "error": {
                        "type": "polarproxy_error",
                        "message": f"polarproxy cannot record this call: {e}",
                    },
                }
                msg.content = orjson.dumps(error)  # the client sees the failure, not an unrecorded answer
        elif ex.cut:
            msg.drop()
        final = self._event(ex, content, kind)  # as the server sent it
        if final:
            sock.pending.popleft()
            if ex.cut:
                return
            self._remember(sock, ex)
            await self._finish(ex, None)  # before the final event reaches the client (T6)

    def _request(self, sock: Socket, content: bytes, kind: Opcode, at: float) -> None:
        if kind != Opcode.TEXT:
            return
        try:
            body = orjson.loads(content)
        except orjson.JSONDecodeError:
            return  # not a request of the Responses protocol: passed on, not a call
        if not isinstance(body, dict) or body.get("type") != "response.create":
            return  # `response.processed` and the like
        request = {k: v for k, v in body.items() if k != "type"}
        problem = None
        previous = request.get("previous_response_id")
        if isinstance(previous, str) and previous in sock.history and isinstance(request.get("input"), list):
            request = {**request, "input": sock.history[previous] + request["input"]}
            del request["previous_response_id"]
        dialect = route("POST", sock.path.partition("?")[0])
        conv = None
        try:
            assert dialect is not None and dialect.name == DIALECT
            conv = dialect.parse(request, path=sock.path.partition("?")[0], query={})
        except DialectError as e:
            problem = f"the request did not parse as {DIALECT}: {e.message}"
        start = CallStart(
            episode_id=self.interceptor.episode_id,
            dialect=DIALECT,
            method="WEBSOCKET",
            path=sock.path,
            model=conv.model if conv else "",
            stream=True,
            request_headers=sock.headers,
            request_body=content.decode("utf-8", "replace"),
            conversation=conv.to_dict() if conv else None,
            prompt_ids=[],
            backend=sock.backend,
            backend_kind="provider",
            fidelity="text",
            started_at=at,
        )
        items = request["input"] if isinstance(request.get("input"), list) else []
        warm_up = request.get("generate") is False  # Codex's prewarm: no model output, not a call
        begun = None if warm_up else asyncio.ensure_future(self.interceptor.writer.begin_call(start))
        sock.pending.append(Exchange(begun=begun, start=start, request_items=items, request_problem=problem))

    def _event(self, ex: Exchange, content: bytes, kind: Opcode) -> bool:
        """Read one server message into the exchange; True when it ends the response."""
        if kind != Opcode.TEXT:
            ex.problem = (
                ex.problem or "the server sent a binary WebSocket message (the Responses events are text)"
            )
            ex.events.append(_sse_block("binary", content.hex()))
            return False
        text = content.decode("utf-8", "replace")
        try:
            data = orjson.loads(content)
        except orjson.JSONDecodeError as e:
            ex.events.append(_sse_block(None, text))
            ex.problem = ex.problem or f"a WebSocket event is not JSON ({e}): {text[:200]!r}"
            return False
        kind_name = data.get("type") if isinstance(data, dict) else None
        ex.events.append(_sse_block(kind_name if isinstance(kind_name, str) else None, text))
        if kind_name in FINAL and isinstance(data.get("response"), dict):
            ex.final_response = data["response"]
        if kind_name == "error":
            status = data.get("status", data.get("status_code"))
            ex.status = status if isinstance(status, int) and not isinstance(status, bool) else None
            ex.error_detail = _error_detail(data)
            if ex.status is None or ex.status < 400:
                ex.problem = ex.problem or f"the provider reported an error: {ex.error_detail}"
            return True
        if ex.problem is None:
            try:
                if ex.parser.event(data, str(kind_name or "message")) and ex.first_output_at is None:
                    ex.first_output_at = time.time()
            except ReplyError as e:
                ex.problem = str(e)
        return kind_name in FINAL

    @staticmethod
    def _remember(sock: Socket, ex: Exchange) -> None:
        """Keep what a later `previous_response_id` on this socket stands for: this input and its output."""
        r = ex.final_response
        if r is not None and isinstance(r.get("id"), str) and isinstance(r.get("output"), list):
            sock.history[r["id"]] = ex.request_items + r["output"]

    @staticmethod
    def _reply(ex: Exchange) -> Reply:
        if ex.problem is None:
            try:
                return ex.parser.result()
            except ReplyError as e:
                ex.problem = str(e)
        return ex.parser.reply

    async def _finish(self, ex: Exchange, connection_error: str | None) -> None:
        assert ex.begun is not None
        await self.interceptor.finish_exchange(
            begun=ex.begun,
            started=ex.start.started_at,
            reply=self._reply(ex),
            body=ex.body,
            first_output_at=ex.first_output_at,
            status=ex.status,
            error_detail=ex.error_detail,
            request_problem=ex.request_problem,
            read_problem=ex.problem,
            connection_error=connection_error,
            partial=bool(ex.events),
        )

    async def end(self, flow: http.HTTPFlow) -> None:
        """The socket closed: every response still open is cut short, with the reason."""
        sock: Socket | None = flow.metadata.pop(META_KEY, None)
        if sock is None:
            return
        ws = flow.websocket
        code = ws.close_code if ws is not None else None
        reason = f" {ws.close_reason!r}" if ws is not None and ws.close_reason else ""
        if ws is not None and ws.closed_by_client:
            why = f"the client closed the WebSocket (code {code}{reason}) before the response's final event"
        elif flow.error is not None and ws is not None and ws.closed_by_client is None:
            why = f"the WebSocket failed ({flow.error.msg}) before the response's final event"
        else:
            why = f"the server closed the WebSocket (code {code}{reason}) before the response's final event"
        while sock.pending:
            ex = sock.pending.popleft()
            if ex.cut or ex.begun is None:
                continue
            try:
                await ex.begun
            except Exception as e:
                log.error("polarproxy could not record a WebSocket call to %s (%s)", sock.backend, e)
                continue
            await self._finish(ex, why)
