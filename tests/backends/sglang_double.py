"""A loopback HTTP server that follows SGLang 0.5's native `/generate` contract (a test double).

SGLang needs a GPU and cannot run on these machines, so polarproxy's SGLang client is tested against
this double. It reproduces what the real server does at the HTTP boundary, read from SGLang's source
(sgl-project/sglang, not copied):

- `python/sglang/srt/entrypoints/http_server.py`: `/generate` (POST/PUT); a `ValueError` becomes
  `400 {"error": {"message": ...}}` for a plain request and, once a stream has started, an error chunk
  `data: {"error": {"message": ...}}` followed by `data: [DONE]`; pydantic validation of the body becomes
  `400 {"object": "error", "message": ..., "type": "Bad Request", "param": null, "code": 400}`; an
  `HTTPException` (aborts with status 500/503) becomes the same ErrorResponse with `type` set to the
  status as text; any other exception (e.g. the `TypeError` that an unknown `sampling_params` key raises
  in `SamplingParams(**kwargs)`) is Starlette's bare `500 Internal Server Error`, and in a stream that
  has started it breaks the connection. `/health` and `/health_generate`, `/get_model_info` (and
  `/model_info`), `/get_server_info`, `/get_weight_version`, `/update_weight_version`.
- Weight updates (`http_server.py`, `tokenizer_manager.py` / its pause controller, `io_struct.py`):
  `POST /update_weights_from_disk` takes UpdateWeightFromDiskReqInput (`model_path` required; `load_format`,
  `abort_all_requests` false, `weight_version`, `is_async`, `torch_empty_cache`, `keep_pause`,
  `recapture_cuda_graph`, `token_step`, `flush_cache` true, `manifest`) and answers `{"success",
  "message", "num_paused_requests"}`, 200 or 400; the message is "Succeeded to update model weights."
  plus " Weight version updated to V." when one was given, and the version changes only on success.
  Unless the server is paused it takes the model-update writer lock: it waits for the requests in
  flight (each holds the reader lock for its whole generation) and new requests wait for it.
  `abort_all_requests` aborts those in flight first. `POST /pause_generation` takes
  PauseGenerationReqInput `{"mode": "abort" | "retract" | "in_place"}` (default "abort": abort every
  request and return once none holds the lock; the others pause the scheduler, whose running requests
  resume on continue) and answers `{"message": "Generation paused successfully.", "status": "ok"}`;
  new requests wait while paused, and a paused server updates weights at once (no writer lock).
  `POST /continue_generation` takes ContinueGenerationReqInput (`torch_empty_cache`) and answers
  `{"message": "Generation continued successfully.", "status": "ok"}`. Both need a JSON object body.
- `python/sglang/srt/managers/io_struct.py` (`GenerateReqInput`): exactly one of `text` / `input_ids`
  (else "Either text, input_ids or input_embeds should be provided."); unknown top-level keys are
  ignored; `return_logprob`, `logprob_start_len` (-1: output logprobs only), `return_text_in_logprobs`,
  `stream`, `rid`.
- `python/sglang/srt/sampling/sampling_params.py`: the allowed `sampling_params` keys and `verify()`'s
  range checks and messages; temperature 0 means greedy.
- `python/sglang/srt/managers/tokenizer_manager.py`: the context-length and vocabulary checks; the
  response `{"text", "output_ids", "meta_info"}` with `meta_info` = `id`, `finish_reason`,
  `prompt_tokens`, `weight_version`, `input_token_logprobs`, `output_token_logprobs` (`[logprob, id,
  text]` triples, text null unless `return_text_in_logprobs`), `completion_tokens`, `cached_tokens`,
  `e2e_latency` (final answer only); streaming chunks are cumulative (full text, IDs and logprobs so
  far) unless the server runs with `--incremental-streaming-output`, when text, IDs and logprobs are
  deltas and `completion_tokens` stays cumulative; aborts: status 400 → ValueError, 500/503 →
  HTTPException, otherwise an ordinary answer whose finish reason is the abort.
- `python/sglang/srt/managers/schedule_batch.py`: finish reasons `{"type": "stop", "matched": ID}`,
  `{"type": "stop", "matched": "STR"}`, `{"type": "length", "length": N}`,
  `{"type": "abort", "message": ..., "status_code": ..., "err_type": ...}`. `output_ids` include the
  matched stop token, and so do the logprobs; the text leaves it out (`no_stop_trim` keeps it).

The "model" is a script: `outputs` is the token sequence it samples, `logprob(i, id)` the logprob of
the i-th sampled token. Faults are set on `SGLangDouble.fault` per test.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson

SGLANG_VERSION = "0.5.4"

# SamplingParams.__init__ keyword arguments in SGLang 0.5 (sampling_params.py).
SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens",
        "stop",
        "stop_token_ids",
        "stop_regex",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "min_new_tokens",
        "n",
        "json_schema",
        "regex",
        "ebnf",
        "structural_tag",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "no_stop_trim",
        "custom_params",
        "stream_interval",
        "logit_bias",
        "sampling_seed",
    }
)
_SAMPLING_EPS = 1e-6


class _TypeErrorFromSGLang(Exception):
    """What SGLang raises outside its ValueError handling: a bare 500, or a broken stream."""


@dataclass
class Fault:
    """Misbehaviour for the next requests (set `SGLangDouble.fault`)."""

    error_after: int | None = None  # raise ValueError after this many tokens
    error_message: str = "Detokenizer failed: out of memory"
    abort_after: int | None = None  # finish with an abort after this many tokens
    abort_status: int | None = None  # None (plain abort), 400, 500 or 503
    abort_message: str = "Abort in waiting queue"
    drop_after: int | None = None  # close the connection after this many streamed tokens
    health_status: int = 200  # what /health answers (503 while starting or unhealthy)


@dataclass
class SGLangDouble:
    """An SGLang-0.5-shaped server on loopback: `with SGLangDouble(outputs=[...]) as d: d.url`."""

    outputs: list[int]
    logprob: Callable[[int, int], float] = lambda i, tid: -0.25 - 0.01 * i
    token_text: Callable[[int], str] = lambda tid: f"<{tid}>"
    special_ids: frozenset[int] = frozenset()
    eos_token_ids: frozenset[int] = frozenset()
    vocab_size: int = 1000
    context_length: int = 4096
    weight_version: str = "default"
    model_path: str = "/models/double"
    incremental_streaming_output: bool = False
    fault: Fault = field(default_factory=Fault)
    requests: list[dict[str, Any]] = field(default_factory=list)
    token_delay: float = 0.0  # seconds between sampled tokens (to interleave weight updates with streams)
    # The "weights" a model_path holds: None loads it, a string is the reason it cannot be loaded.
    # By default a folder with a config.json loads.
    load_problem: Callable[[str], str | None] = lambda path: _default_load_problem(path)
    admin: list[tuple[str, Any]] = field(default_factory=list)  # (path, body) of every admin POST

    def __post_init__(self) -> None:
        self.paused = False
        self.pause_mode = "abort"
        self.in_flight = 0
        self._updating = 0
        self._abort_epoch = 0
        self._cond = threading.Condition()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.double = self  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> SGLangDouble:
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05})
        self._thread.daemon = True
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # -- the "model" --------------------------------------------------------------------------------

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return "".join(self.token_text(t) for t in ids if not (skip_special_tokens and t in self.special_ids))

    # -- the model-update lock and the pause state (TokenizerManager) ------------------------------

    def admit(self) -> int:
        """Wait while paused or while a weight update holds the writer lock; returns the abort epoch."""
        with self._cond:
            while self.paused or self._updating:
                self._cond.wait(0.02)
            self.in_flight += 1
            return self._abort_epoch

    def release(self) -> None:
        with self._cond:
            self.in_flight -= 1
            self._cond.notify_all()

    def between_tokens(self, epoch: int) -> bool:
        """Hold a running request while the scheduler is paused (in_place / retract); True once aborted."""
        with self._cond:
            while self.paused and self.pause_mode != "abort" and epoch == self._abort_epoch:
                self._cond.wait(0.02)
            return epoch != self._abort_epoch

    def abort_all(self) -> None:
        with self._cond:
            self._abort_epoch += 1
            self._cond.notify_all()

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
        }

    def server_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "served_model_name": self.model_path,
            "context_length": self.context_length,
            "weight_version": self.weight_version,
            "incremental_streaming_output": self.incremental_streaming_output,
            "skip_tokenizer_init": False,
            "internal_states": [{}],
            "version": SGLANG_VERSION,
        }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    @property
    def double(self) -> SGLangDouble:
        return self.server.double  # type: ignore[attr-defined]

    # -- plumbing -----------------------------------------------------------------------------------

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, orjson.dumps(obj))

    def _value_error(self, message: str) -> None:  # http_server._create_error_response
        self._json(400, {"error": {"message": message}})

    def _validation_error(self, message: str) -> None:  # RequestValidationError → 400 ErrorResponse
        self._json(
            400, {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
        )

    def _http_exception(self, status: int, message: str) -> None:  # HTTPException handler
        self._json(
            status,
            {"object": "error", "message": message, "type": str(status), "param": None, "code": status},
        )

    def _internal_error(self) -> None:  # Starlette's ServerErrorMiddleware
        self.close_connection = True
        self._send(500, b"Internal Server Error", "text/plain; charset=utf-8")

    def _body(self) -> bytes:
        n = int(self.headers.get("content-length") or 0)
        return self.rfile.read(n) if n else b""

    # -- routes -------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        d = self.double
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate"):
            self._send(d.fault.health_status, b"", "text/plain")
        elif path in ("/get_model_info", "/model_info"):
            self._json(200, d.model_info())
        elif path in ("/get_server_info", "/server_info"):
            self._json(200, d.server_info())
        elif path == "/get_weight_version":
            self._json(200, {"weight_version": d.weight_version})
        elif path == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": d.model_path,
                            "object": "model",
                            "created": int(time.time()),
                            "owned_by": "sglang",
                            "root": d.model_path,
                            "max_model_len": d.context_length,
                        }
                    ],
                },
            )
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        raw = self._body()
        if path == "/generate":
            self._generate(raw)
        elif path == "/update_weights_from_disk":
            self._update_weights_from_disk(raw)
        elif path == "/pause_generation":
            self._pause(raw)
        elif path == "/continue_generation":
            self._continue(raw)
        elif path == "/update_weight_version":
            try:
                obj = orjson.loads(raw)
                self.double.weight_version = str(obj["new_version"])
            except (orjson.JSONDecodeError, KeyError, TypeError) as e:
                self._validation_error(f"invalid request: {e!r}")
                return
            v = self.double.weight_version
            self._json(200, {"success": True, "message": f"Weight version updated to {v}", "new_version": v})
        else:
            self._json(404, {"detail": "Not Found"})

    do_PUT = do_POST

    # -- weight updates -----------------------------------------------------------------------------

    def _admin_body(self, path: str, raw: bytes) -> dict[str, Any] | None:
        """The JSON object body FastAPI requires (else a 400 validation error, answered here)."""
        try:
            obj = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            obj = None
        self.double.admin.append((path, obj))
        if not isinstance(obj, dict):
            self._validation_error("[{'type': 'missing', 'loc': ('body',), 'msg': 'Field required'}]")
            return None
        return obj

    def _update_weights_from_disk(self, raw: bytes) -> None:
        d = self.double
        obj = self._admin_body("/update_weights_from_disk", raw)
        if obj is None:
            return
        model_path = obj.get("model_path")
        if not isinstance(model_path, str):
            self._validation_error(
                "[{'type': 'missing', 'loc': ('body', 'model_path'), 'msg': 'Field required'}]"
            )
            return
        version = obj.get("weight_version")
        if obj.get("abort_all_requests"):
            d.abort_all()
        with d._cond:
            locked = not d.paused  # a paused engine is updated at once
            if locked:
                d._updating += 1
                while d.in_flight:
                    d._cond.wait(0.02)
        try:
            problem = d.load_problem(model_path)
            if problem is None:
                d.model_path = model_path
                if version is not None:
                    d.weight_version = str(version)
        finally:
            if locked:
                with d._cond:
                    d._updating -= 1
                    d._cond.notify_all()
        if problem is not None:
            self._json(400, {"success": False, "message": problem, "num_paused_requests": 0})
            return
        message = "Succeeded to update model weights."
        if version is not None:
            message += f" Weight version updated to {version}."
        self._json(200, {"success": True, "message": message, "num_paused_requests": 0})

    def _pause(self, raw: bytes) -> None:
        d = self.double
        obj = self._admin_body("/pause_generation", raw)
        if obj is None:
            return
        mode = obj.get("mode", "abort")
        if mode not in ("abort", "retract", "in_place"):
            self._validation_error(
                f"[{{'type': 'value_error', 'loc': ('body',), 'msg': \"Value error, Invalid mode: {mode!r}. "
                "Expected one of ['abort', 'retract', 'in_place'].\"}]"
            )
            return
        with d._cond:
            d.paused, d.pause_mode = True, mode
        if mode == "abort":  # abort, then poll the lock until no request holds it
            while True:
                d.abort_all()
                with d._cond:
                    if not d.in_flight:
                        break
                time.sleep(0.02)
        self._json(200, {"message": "Generation paused successfully.", "status": "ok"})

    def _continue(self, raw: bytes) -> None:
        d = self.double
        if self._admin_body("/continue_generation", raw) is None:
            return
        with d._cond:
            d.paused = False
            d._cond.notify_all()
        self._json(200, {"message": "Generation continued successfully.", "status": "ok"})

    # -- /generate ----------------------------------------------------------------------------------

    def _generate(self, raw: bytes) -> None:
        d = self.double
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            self._validation_error(
                f"[{{'type': 'json_invalid', 'loc': ('body', {e.pos}), 'msg': 'JSON decode error'}}]"
            )
            return
        problem = _pydantic_problem(obj)
        if problem is not None:
            self._validation_error(problem)
            return
        d.requests.append(obj)
        stream = bool(obj.get("stream"))
        try:
            req = _prepare(d, obj)
        except ValueError as e:
            if stream:
                self._stream_head()
                self._chunk(orjson.dumps({"error": {"message": str(e)}}))
                self._done()
            else:
                self._value_error(str(e))
            return
        except _TypeErrorFromSGLang:
            if stream:  # headers went out, then the ASGI app died mid-body
                self._stream_head()
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)
            else:
                self._internal_error()
            return
        req.epoch = d.admit()  # the model-update reader lock, held for the whole generation
        try:
            if stream:
                self._stream(req)
            else:
                self._once(req)
        finally:
            d.release()

    def _once(self, req: _Req) -> None:
        d = self.double
        steps = list(_run(d, req))
        final = steps[-1]
        if final.error is not None:
            self._value_error(final.error)
            return
        fr = final.finish
        assert fr is not None
        if fr["type"] == "abort" and fr.get("status_code") == 400:
            self._value_error(fr["message"])
            return
        if fr["type"] == "abort" and fr.get("status_code") in (500, 503):
            self._http_exception(fr["status_code"], fr["message"])
            return
        self._json(200, _out(d, req, final.ids, fr, final=True))

    def _stream_head(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        payload = b"data: " + data + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        self.wfile.flush()

    def _done(self) -> None:
        payload = b"data: [DONE]\n\n"
        self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(payload), payload))
        self.wfile.flush()

    def _stream(self, req: _Req) -> None:
        d = self.double
        self._stream_head()
        sent = 0
        for step in _run(d, req):
            if d.fault.drop_after is not None and len(step.ids) > d.fault.drop_after:
                self.close_connection = True
                self.connection.shutdown(2)
                return
            if step.error is not None:
                self._chunk(orjson.dumps({"error": {"message": step.error}}))
                break
            out = _out(d, req, step.ids, step.finish, final=step.finish is not None)
            if d.incremental_streaming_output:
                out["output_ids"] = out["output_ids"][sent:]
                out["text"] = out["text"][len(_out(d, req, step.ids[:sent], None, final=False)["text"]) :]
                meta = out["meta_info"]
                for key in ("output_token_logprobs",):
                    if key in meta:
                        meta[key] = meta[key][sent:]
            sent = len(step.ids)
            self._chunk(orjson.dumps(out))
        self._done()


@dataclass
class _Req:
    rid: str
    input_ids: list[int]
    sp: dict[str, Any]
    return_logprob: bool
    return_text_in_logprobs: bool
    started: float
    epoch: int = 0


@dataclass
class _Step:
    ids: list[int]
    finish: dict[str, Any] | None
    error: str | None = None


def _is_int_list(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)


def _pydantic_problem(obj: Any) -> str | None:
    """What FastAPI's validation of GenerateReqInput rejects (types only; values are checked later)."""
    if not isinstance(obj, dict):
        return f"[{{'type': 'dataclass_type', 'loc': ('body',), 'msg': 'Input should be a dictionary', 'input': {obj!r}}}]"
    ids = obj.get("input_ids")
    if ids is not None and not (
        _is_int_list(ids) or (isinstance(ids, list) and all(_is_int_list(x) for x in ids))
    ):
        return "[{'type': 'list_type', 'loc': ('body', 'input_ids'), 'msg': 'Input should be a valid list'}]"
    text = obj.get("text")
    if text is not None and not isinstance(text, str | list):
        return "[{'type': 'string_type', 'loc': ('body', 'text'), 'msg': 'Input should be a valid string'}]"
    sp = obj.get("sampling_params")
    if sp is not None and not isinstance(sp, dict | list):
        return "[{'type': 'dict_type', 'loc': ('body', 'sampling_params'), 'msg': 'Input should be a valid dictionary'}]"
    for key in ("stream", "return_text_in_logprobs"):
        if key in obj and not isinstance(obj[key], bool):
            return f"[{{'type': 'bool_type', 'loc': ('body', '{key}'), 'msg': 'Input should be a valid boolean'}}]"
    return None


def _prepare(d: SGLangDouble, obj: dict[str, Any]) -> _Req:
    """GenerateReqInput normalisation, SamplingParams(**kw).normalize().verify(), length checks."""
    text, input_ids = obj.get("text"), obj.get("input_ids")
    if (text is None and input_ids is None) or (text is not None and input_ids is not None):
        raise ValueError("Either text, input_ids or input_embeds should be provided.")
    if input_ids is None:
        raise ValueError("The double tokenizes nothing: send input_ids.")
    if input_ids and isinstance(input_ids[0], list):
        raise ValueError("The double serves one request at a time: send one input_ids list.")
    sp = dict(obj.get("sampling_params") or {})
    unknown = sorted(set(sp) - SAMPLING_KEYS)
    if unknown:  # SamplingParams.__init__() got an unexpected keyword argument → TypeError
        raise _TypeErrorFromSGLang(unknown[0])
    temperature = 1.0 if sp.get("temperature") is None else float(sp["temperature"])
    top_p = 1.0 if sp.get("top_p") is None else float(sp["top_p"])
    top_k = -1 if sp.get("top_k") is None else int(sp["top_k"])
    min_p = 0.0 if sp.get("min_p") is None else float(sp["min_p"])
    max_new = sp.get("max_new_tokens", 128)
    min_new = 0 if sp.get("min_new_tokens") is None else int(sp["min_new_tokens"])
    if 0 <= temperature < _SAMPLING_EPS:
        temperature, top_k = 1.0, 1
    if not math.isfinite(temperature) or temperature < 0.0:
        raise ValueError(f"temperature must be non-negative, got {temperature}.")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}.")
    if not 0.0 <= min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {min_p}.")
    if top_k < 1 and top_k != -1:
        raise ValueError(f"top_k must be -1 (disable), or at least 1, got {top_k}.")
    if max_new is not None:
        if max_new < 0:
            raise ValueError(f"max_new_tokens must be at least 0, got {max_new}.")
        if not 0 <= min_new <= max_new:
            raise ValueError(f"min_new_tokens must be in [0, max_new_tokens({max_new})], got {min_new}.")
    if any(t >= d.vocab_size for t in input_ids):
        raise ValueError(
            f"The input_ids {input_ids} contains values greater than the vocab size ({d.vocab_size})."
        )
    if len(input_ids) >= d.context_length:
        raise ValueError(
            f"The input ({len(input_ids)} tokens) is longer than the model's context length "
            f"({d.context_length} tokens)."
        )
    if max_new is not None and len(input_ids) + max_new > d.context_length:
        raise ValueError(
            "Requested token count exceeds the model's maximum context length of "
            f"{d.context_length} tokens. You requested a total of {len(input_ids) + max_new} tokens: "
            f"{len(input_ids)} tokens from the input messages and {max_new} tokens for the completion. "
            "Please reduce the number of tokens in the input messages or the completion to fit within the limit."
        )
    stop = sp.get("stop") or []
    sp["stop"] = [stop] if isinstance(stop, str) else list(stop)
    sp["max_new_tokens"] = max_new
    return _Req(
        rid=obj.get("rid") if isinstance(obj.get("rid"), str) else uuid.uuid4().hex,
        input_ids=list(input_ids),
        sp=sp,
        return_logprob=bool(obj.get("return_logprob")),
        return_text_in_logprobs=bool(obj.get("return_text_in_logprobs")),
        started=time.monotonic(),
    )


def _run(d: SGLangDouble, req: _Req):  # -> Iterator[_Step]
    """One step per sampled token (stream_interval 1); the last step has the finish reason."""
    sp, fault = req.sp, d.fault
    stop_ids = set(sp.get("stop_token_ids") or [])
    if not sp.get("ignore_eos"):
        stop_ids |= set(d.eos_token_ids)
    max_new = sp["max_new_tokens"]
    if max_new == 0:
        yield _Step([], {"type": "length", "length": 0})
        return
    ids: list[int] = []
    for i, tid in enumerate(d.outputs):
        if i and d.token_delay:
            time.sleep(d.token_delay)
        if d.between_tokens(req.epoch):  # aborted by pause_generation or abort_all_requests
            yield _Step(list(ids), {"type": "abort", "message": None, "status_code": None, "err_type": None})
            return
        if fault.error_after is not None and i >= fault.error_after:
            yield _Step(list(ids), None, error=fault.error_message)
            return
        if fault.abort_after is not None and i >= fault.abort_after:
            yield _Step(
                list(ids),
                {
                    "type": "abort",
                    "message": fault.abort_message,
                    "status_code": fault.abort_status,
                    "err_type": None if fault.abort_status is None else "BadRequestError",
                },
            )
            return
        ids.append(tid)
        finish: dict[str, Any] | None = None
        min_ok = len(ids) >= int(sp.get("min_new_tokens") or 0)
        if tid in stop_ids and min_ok:
            finish = {"type": "stop", "matched": tid}
        elif min_ok and (s := _matched_str(d, ids, sp)) is not None:
            finish = {"type": "stop", "matched": s}
        elif len(ids) >= max_new:
            finish = {"type": "length", "length": max_new}
        yield _Step(list(ids), finish)
        if finish is not None:
            return
    yield _Step(list(ids), {"type": "length", "length": len(ids)})  # the script ran out


def _default_load_problem(path: str) -> str | None:
    """SGLang reads the new folder's config first (ModelConfig): a folder without one fails there."""
    if not (Path(path) / "config.json").is_file():
        return f"Failed to load model config: {path} does not appear to have a file named config.json."
    return None


def _matched_str(d: SGLangDouble, ids: list[int], sp: dict[str, Any]) -> str | None:
    text = d.decode(ids, bool(sp.get("skip_special_tokens", True)))
    for s in sp["stop"]:
        if s and s in text:
            return s
    return None


def _out(
    d: SGLangDouble, req: _Req, ids: list[int], finish: dict[str, Any] | None, *, final: bool
) -> dict[str, Any]:
    sp = req.sp
    skip = True if sp.get("skip_special_tokens") is None else bool(sp["skip_special_tokens"])
    shown = ids
    trim = not sp.get("no_stop_trim") and finish is not None and finish.get("type") == "stop"
    if trim and isinstance(finish.get("matched"), int) and shown:  # type: ignore[union-attr]
        shown = shown[:-1]
    text = d.decode(shown, skip)
    if trim and isinstance(finish.get("matched"), str):  # type: ignore[union-attr]
        text = text[: text.find(finish["matched"])]  # type: ignore[index]
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": finish,
        "prompt_tokens": len(req.input_ids),
        "weight_version": d.weight_version,
    }
    if req.return_logprob:
        last = req.input_ids[-1] if req.input_ids else None
        meta["input_token_logprobs"] = [[None, last, None]] if last is not None else []
        meta["output_token_logprobs"] = [
            [d.logprob(i, t), t, d.token_text(t) if req.return_text_in_logprobs else None]
            for i, t in enumerate(ids)
        ]
    meta["completion_tokens"] = len(ids)
    meta["cached_tokens"] = 0
    if final:
        meta["e2e_latency"] = time.monotonic() - req.started
    return {"text": text, "output_ids": list(ids), "meta_info": meta}
