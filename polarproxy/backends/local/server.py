"""An HTTP server with SGLang 0.5's native contract over a `ModelRunner` (`polarproxy backend`).

Endpoints: ``POST /generate`` (``input_ids`` or ``text``, ``sampling_params``, ``return_logprob``,
``stream``), ``GET /health``, ``/health_generate``, ``/model_info`` (also ``/get_model_info``),
``/get_weight_version``, ``/get_server_info``, ``/v1/models``, and ``POST /update_weights_from_disk``,
``/update_weight_version``, ``/pause_generation``, ``/continue_generation``, ``/flush_cache``.
Errors have SGLang's shape ``{"error": {"message": ...}}`` with status 400; a streamed request that
fails validation gets status 200, that error as one event, then ``[DONE]``, as from SGLang.

One generation runs at a time (the runner's lock); health and info stay responsive meanwhile. A
client that disconnects stops its generation. `max_new_tokens_limit` caps every request.

Weight updates follow SGLang (`admin.py`, `gate.py`): `/update_weights_from_disk` loads the new folder while the
old weights keep serving, then waits for the generations in flight to finish and swaps, holding new
ones back meanwhile, so every call's tokens come from one weight version; a folder that cannot be
loaded answers `success: false` and changes nothing. The new `weight_version` is the request's, else
the checkpoint's `polarproxy.json`. `/pause_generation` (`mode`: `abort`, the default, aborts the
generations in flight; `in_place` / `retract` freeze them) stops admitting new ones until
`/continue_generation`; a paused server swaps at once, so a frozen generation continues on the new
weights and reports both versions.
"""

from __future__ import annotations

import hmac
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson

from polarproxy.backends.local import admin
from polarproxy.backends.local.gate import GateClosed, Ticket, WeightGate
from polarproxy.backends.local.model_runner import GenStep, ModelRunner, SamplingParams
from polarproxy.backends.local.output_text import IncrementalText, final_text
from polarproxy.backends.local.request import GenerateRequest, RequestError, json_object, parse_generate
from polarproxy.backends.local.script import Script, scripted_steps
from polarproxy.loopback import is_json, loopback_host

log = logging.getLogger("polarproxy.backends.local")

MAX_BODY_BYTES = 256 * 1024 * 1024


# The finish reason of a generation that `/pause_generation` (mode "abort") or `abort_all_requests` ended.
ABORTED_BY_PAUSE: dict[str, Any] = {
    "type": "abort",
    "message": "Aborted by a weight update (pause_generation mode 'abort' or abort_all_requests).",
    "status_code": None,
    "err_type": None,
}


# every route but /generate, /health* and the read-only info routes: POST and PUT, and GET /flush_cache
ADMIN_ROUTES = frozenset({*admin.ANSWERS, "/flush_cache"})


class LocalBackendServer(ThreadingHTTPServer):
    """The HTTP server; `port` is the bound port (useful with port 0). Its admin routes (`ADMIN_ROUTES`)
    take JSON only, from a loopback Host, and with `api_key` set only with that key."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        runner: ModelRunner,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        weight_version: str = "default",
        max_new_tokens_limit: int | None = None,
        served_model_name: str | None = None,
        script: Script | None = None,
        api_key: str | None = None,
    ) -> None:
        if max_new_tokens_limit is not None and max_new_tokens_limit < 0:
            raise ValueError(f"max_new_tokens_limit must be >= 0, got {max_new_tokens_limit}")
        self.runner = runner
        self.api_key = api_key or None  # the admin routes need it (`--api-key`, POLARPROXY_SYNC_API_KEY)
        self.script = script
        self.weight_version = weight_version
        self.max_new_tokens_limit = max_new_tokens_limit
        self.served_model_name = served_model_name or str(runner.model_dir)
        self.created = int(time.time())
        self.gate = WeightGate()
        self.swap_lock = threading.Lock()  # one weight update at a time
        super().__init__((host, port), _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        host = self.server_address[0]
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": str(self.runner.model_dir),
            "tokenizer_path": str(self.runner.model_dir),
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
            "served_model_name": self.served_model_name,
            "context_length": self.runner.context_length,
        }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: LocalBackendServer
    server_version = "polarproxy-local"

    # -- plumbing --------------------------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, status: int, obj: Any) -> None:
        self._send(status, orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS))

    def _send_error(self, message: str, status: int = HTTPStatus.BAD_REQUEST) -> None:
        self._send_json(status, {"error": {"message": message}})

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            total = 0
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                total += size
                if total > MAX_BODY_BYTES:
                    raise RequestError("Request body too large.")
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            raise RequestError("Request body too large.")
        return self.rfile.read(length) if length else b""

    def _client_gone(self) -> bool:
        """True once the peer has closed its side of the connection."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _should_stop(self) -> bool:
        gate, ticket = self.server.gate, self._ticket
        if ticket is None:
            return self._client_gone()
        gate.wait_while_frozen(ticket, self._client_gone)
        return gate.aborted(ticket) or self._client_gone()

    _ticket: Ticket | None = None

    # -- routing ---------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        srv = self.server
        if path in ADMIN_ROUTES and not self._admin_allowed():
            return
        if path == "/health":
            self._send(200, b"", "text/plain")
        elif path == "/health_generate":
            self._health_generate()
        elif path in ("/model_info", "/get_model_info"):
            self._send_json(200, srv.model_info())
        elif path == "/get_weight_version":
            self._send_json(200, {"weight_version": srv.weight_version})
        elif path == "/get_server_info":
            self._send_json(
                200,
                {
                    **srv.model_info(),
                    "max_new_tokens_limit": srv.max_new_tokens_limit,
                    "prefill_chunk": srv.runner.prefill_chunk,
                    "device": str(srv.runner.device),
                    "backend": "polarproxy-local",
                },
            )
        elif path == "/v1/models":
            self._send_json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": srv.served_model_name,
                            "object": "model",
                            "created": srv.created,
                            "owned_by": "polarproxy",
                            "root": srv.served_model_name,
                            "max_model_len": srv.runner.context_length,
                        }
                    ],
                },
            )
        elif path == "/flush_cache":
            self._send(200, b"Cache flushed.\n", "text/plain")
        else:
            self._send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            body = self._read_body()  # read (within its limit) even when refused: the connection goes on
        except (RequestError, ValueError) as e:
            self.close_connection = True
            self._send_error(str(e))
            return
        if path in ADMIN_ROUTES and not self._admin_allowed(write=True):
            return
        handlers = {
            "/generate": self._generate,
            **{route: self._admin(answer) for route, answer in admin.ANSWERS.items()},
            "/flush_cache": lambda _body: self._send(200, b"Cache flushed.\n", "text/plain"),
        }
        handler = handlers.get(path)
        if handler is None:
            self._send_json(404, {"detail": "Not Found"})
            return
        try:
            handler(body)
        except RequestError as e:
            self._send_error(str(e))

    do_PUT = do_POST

    # -- admin endpoints -------------------------------------------------------------------------------

    def _admin_allowed(self, *, write: bool = False) -> bool:
        """Whether this request may use an admin route (weights, pause, cache); else answered here. With an
        API key it must carry it (`Authorization: Bearer KEY`, as SGLang's `--api-key`); without one, its
        Host must be a loopback name (DNS rebinding). A write must be JSON (a cross-site simple POST is not)."""
        srv = self.server
        if srv.api_key is not None:
            scheme, _, value = (self.headers.get("authorization") or "").partition(" ")
            given = value.strip().encode() if scheme.lower() == "bearer" else b""
            if not hmac.compare_digest(given, srv.api_key.encode()):
                self._send_json(
                    401, {"error": "This admin route needs the server's API key: Authorization: Bearer KEY."}
                )
                return False
        elif not loopback_host(self.headers.get("host")):
            self._send_json(400, {"error": f"Host {self.headers.get('host')!r} is not a loopback name."})
            return False
        if write and not is_json(self.headers.get("content-type")):
            self._send_json(415, {"error": "Admin routes take Content-Type: application/json only."})
            return False
        return True

    def _admin(
        self, answer: Callable[[LocalBackendServer, dict[str, Any]], tuple[int, dict[str, Any]]]
    ) -> Any:
        """A handler of a body that answers an admin route (backends/local/admin.py) with JSON."""
        return lambda body: self._send_json(*answer(self.server, json_object(body)))

    def _health_generate(self) -> None:
        runner = self.server.runner
        if runner.busy:  # a running generation proves health (as in SGLang)
            self._send(200, b"", "text/plain")
            return
        try:
            gen = runner.generate([0], SamplingParams(max_new_tokens=1, temperature=0.0))
            try:
                for _ in gen:
                    pass
            finally:
                gen.close()
        except Exception as e:
            log.exception("health_generate failed")
            self._send(503, str(e).encode(), "text/plain")
            return
        self._send(200, b"", "text/plain")

    # -- /generate -------------------------------------------------------------------------------------

    def _generate(self, body: bytes) -> None:
        streamed = json_object(body).get("stream") is True  # a body that is no object: 400
        try:
            req = parse_generate(body, self.server.runner, self.server.max_new_tokens_limit)
        except RequestError as e:
            if not streamed:
                raise
            self._stream_error(str(e))
            return
        try:
            with self.server.gate.generation(self._client_gone) as ticket:
                self._ticket = ticket
                try:
                    self._run_generation(req)
                finally:
                    self._ticket = None
        except GateClosed:  # the client left while the generation waited for a pause or a weight swap
            self.close_connection = True
            log.info("generation %s dropped before it started: client disconnected", req.rid)

    def _aborted(self) -> bool:
        return self._ticket is not None and self.server.gate.aborted(self._ticket)

    def _run_generation(self, req: GenerateRequest) -> None:
        started = time.monotonic()
        script = self.server.script
        if script is not None:
            try:
                gen = scripted_steps(self.server.runner, script, req.input_ids, req.params)
            except ValueError as e:
                if not req.stream:
                    raise RequestError(str(e)) from None
                self._stream_error(str(e))
                return
        else:
            gen = self.server.runner.generate(req.input_ids, req.params, should_stop=self._should_stop)
        try:
            if req.stream:
                self._generate_stream(req, gen, started)
            else:
                self._generate_once(req, gen, started)
        finally:
            gen.close()

    def _payload(
        self,
        req: GenerateRequest,
        text: str,
        output_ids: list[int],
        logprobs: list[float],
        finish: dict[str, Any] | None,
        started: float,
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": finish,
            "prompt_tokens": len(req.input_ids),
            "weight_version": self.server.weight_version,
            "completion_tokens": len(output_ids),
            "cached_tokens": 0,
        }
        if finish is not None:  # as SGLang: set when the request finishes
            meta["e2e_latency"] = round(time.monotonic() - started, 6)
        if req.return_logprob:
            runner = self.server.runner
            meta["output_token_logprobs"] = [
                [
                    lp,
                    tid,
                    runner.decode([tid], skip_special_tokens=False) if req.return_text_in_logprobs else None,
                ]
                for lp, tid in zip(logprobs, output_ids, strict=True)
            ]
        return {"text": text, "output_ids": list(output_ids), "meta_info": meta}

    def _generate_once(self, req: GenerateRequest, gen: Iterator[GenStep], started: float) -> None:
        output_ids: list[int] = []
        logprobs: list[float] = []
        finish: dict[str, Any] | None = None
        for step in gen:
            output_ids.append(step.token_id)
            logprobs.append(step.logprob)
            finish = step.finish_reason
        if req.params.max_new_tokens == 0:
            finish = {"type": "length", "length": 0}
        if finish is None and self._aborted():  # as SGLang: an ordinary answer whose finish is the abort
            finish = ABORTED_BY_PAUSE
        if finish is None:  # stopped because the client went away
            self.close_connection = True
            log.info("generation %s aborted after %d tokens: client disconnected", req.rid, len(output_ids))
            return
        text = final_text(self.server.runner, output_ids, finish, req.params)
        self._send_json(200, self._payload(req, text, output_ids, logprobs, finish, started))

    def _stream_error(self, message: str) -> None:
        """As SGLang answers a streamed request that fails validation (a ValueError): status 200, one
        error event, then [DONE]."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._write_chunk(b"data: " + orjson.dumps({"error": {"message": message}}) + b"\n\n")
        self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def _generate_stream(self, req: GenerateRequest, gen: Iterator[GenStep], started: float) -> None:
        runner = self.server.runner
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        detok = IncrementalText(
            lambda ids: runner.decode(ids, skip_special_tokens=req.params.skip_special_tokens),
            req.params.stop,
        )
        output_ids: list[int] = []
        logprobs: list[float] = []
        finish: dict[str, Any] | None = None
        try:
            try:
                for step in gen:
                    output_ids.append(step.token_id)
                    logprobs.append(step.logprob)
                    finish = step.finish_reason
                    if finish is None:
                        text = detok.update(output_ids)
                    else:
                        text = final_text(runner, output_ids, finish, req.params)
                    event = self._payload(req, text, output_ids, logprobs, finish, started)
                    self._write_chunk(b"data: " + orjson.dumps(event) + b"\n\n")
                if req.params.max_new_tokens == 0:
                    finish = {"type": "length", "length": 0}
                    event = self._payload(req, "", [], [], finish, started)
                    self._write_chunk(b"data: " + orjson.dumps(event) + b"\n\n")
                elif finish is None and self._aborted():
                    finish = ABORTED_BY_PAUSE
                    text = detok.update(output_ids) if output_ids else ""
                    event = self._payload(req, text, output_ids, logprobs, finish, started)
                    self._write_chunk(b"data: " + orjson.dumps(event) + b"\n\n")
            except ValueError as e:  # as SGLang: an error event, then [DONE]
                log.error("generation %s failed: %s", req.rid, e)
                self._write_chunk(b"data: " + orjson.dumps({"error": {"message": str(e)}}) + b"\n\n")
            if finish is None and req.params.max_new_tokens != 0 and self._client_gone():
                raise ConnectionResetError("client disconnected")
            self._write_chunk(b"data: [DONE]\n\n")
            self._write_chunk(b"")
        except (BrokenPipeError, ConnectionResetError, ConnectionAbortedError):
            self.close_connection = True
            log.info("stream %s aborted after %d tokens: client disconnected", req.rid, len(output_ids))


class LocalServer:
    """A `LocalBackendServer` on a background thread, for tests and embedding:

        with LocalServer(model_dir) as srv:
            httpx.post(f"{srv.url}/generate", json=...)

    Pass a `ModelRunner` instead of a folder to reuse a loaded model.
    """

    def __init__(
        self,
        model: ModelRunner | Path | str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        weight_version: str = "default",
        max_new_tokens_limit: int | None = None,
        served_model_name: str | None = None,
        script: Script | None = None,
        api_key: str | None = None,
    ) -> None:
        runner = model if isinstance(model, ModelRunner) else ModelRunner(model)
        self.httpd = LocalBackendServer(
            runner,
            host,
            port,
            weight_version=weight_version,
            max_new_tokens_limit=max_new_tokens_limit,
            served_model_name=served_model_name,
            script=script,
            api_key=api_key,
        )
        self._thread: threading.Thread | None = None

    @property
    def runner(self) -> ModelRunner:
        return self.httpd.runner

    @property
    def port(self) -> int:
        return self.httpd.port

    @property
    def url(self) -> str:
        return self.httpd.url

    def start(self) -> LocalServer:
        self._thread = threading.Thread(
            target=self.httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="polarproxy-local",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.gate.resume()
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self.httpd.server_close()

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    model_dir: Path,
    host: str,
    port: int,
    *,
    weight_version: str = "default",
    max_new_tokens_limit: int | None = None,
    ready: Callable[[int], None] | None = None,
    served_model_name: str | None = None,
    device: str | None = None,
    script: Script | None = None,
    api_key: str | None = None,
) -> None:
    """Load the model in `model_dir` and serve until interrupted; `ready(port)` once listening
    (port 0 picks a free port). With `script`, answers come from it (teacher-forced logprobs)."""
    runner = ModelRunner(model_dir, device=device)
    httpd = LocalBackendServer(
        runner,
        host,
        port,
        weight_version=weight_version,
        max_new_tokens_limit=max_new_tokens_limit,
        served_model_name=served_model_name,
        script=script,
        api_key=api_key,
    )
    try:
        if ready is not None:
            ready(httpd.port)
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
