"""Serve one harness call from the backend, token-faithfully, and record it (gateway mode).

Per call: render the conversation to prompt IDs, record the call as in flight, ask the backend for
tokens, stream the parsed answer back in the harness's dialect as tokens arrive, and commit the finished
record before the last bytes (finish reason, usage, terminator) go out (T6). Every failure path records
the call with its status and reason, and answers the harness with a provider-shaped error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Protocol

from polarproxy.backends.base import Backend, BackendError, GenerateParams, Generation
from polarproxy.conversation import Completion, Conversation, Usage
from polarproxy.dialects.base import Dialect
from polarproxy.render.detokenize import IncrementalDetokenizer
from polarproxy.render.output_parser import OutputParser
from polarproxy.render.renderer import Renderer
from polarproxy.render.stops import StopTrimmer
from polarproxy.store.records import CallResult, CallStart

log = logging.getLogger("polarproxy.gateway")

SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}
JSON_HEADERS = {"content-type": "application/json"}
# Prompts longer than this are tokenized in a worker thread (the tokenizer releases the GIL there), so one
# long request does not hold up the streams of the others; short ones are cheaper inline.
INLINE_RENDER_CHARS = 16_384
_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def random_id(n: int = 24) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(n))


def new_tool_call_id() -> str:
    return "call_" + random_id(24)


class ClientGone(Exception):
    """The harness hung up before the answer was complete."""


class Sink(Protocol):
    """Where a response goes: the responder's connection back to mitmproxy and on to the harness."""

    async def head(self, status: int, headers: dict[str, str]) -> None: ...

    async def send(self, data: bytes) -> None: ...

    async def end(self) -> None: ...


@dataclass(slots=True)
class PendingCall:
    """A parsed harness request waiting to be served."""

    flow_id: str
    episode_id: str
    dialect: Dialect
    conversation: Conversation
    start: CallStart  # request side of the record, already redacted
    received: float = field(default_factory=time.perf_counter)


@dataclass(slots=True)
class GatewayOptions:
    max_tokens_default: int = 4096
    keepalive_s: float = 15.0


class StoreLike(Protocol):
    async def begin_call(self, start: CallStart) -> tuple[str, int]: ...

    async def finish_call(self, call_id: str, result: CallResult) -> None: ...


async def respond(sink: Sink, status: int, headers: dict[str, str], body: bytes) -> None:
    await sink.head(status, {**headers, "content-length": str(len(body))})
    await sink.send(body)
    await sink.end()


class Gateway:
    def __init__(
        self, *, renderer: Renderer, backend: Backend, store: StoreLike, options: GatewayOptions | None = None
    ) -> None:
        self.renderer = renderer
        self.backend = backend
        self.store = store
        self.options = options or GatewayOptions()

    # -- parameters -----------------------------------------------------------------------------

    def params(self, conv: Conversation) -> GenerateParams:
        s = conv.sampling
        return GenerateParams(
            max_new_tokens=s.max_tokens if s.max_tokens is not None else self.options.max_tokens_default,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            stop=list(s.stop),
            stop_token_ids=list(self.renderer.stop_token_ids),
            seed=s.seed,
        )

    def _text_ids(self, gen: Generation, ids: list[int]) -> list[int]:
        """The new IDs that become text: a matched stop token is kept in the record, not shown."""
        if gen.finish_reason == "stop" and ids and gen.output_ids and ids[-1] == gen.output_ids[-1]:
            last = gen.output_ids[-1]
            if last in self.renderer.stop_token_ids or last == gen.matched_stop:
                return ids[:-1]
        return ids

    # -- serving --------------------------------------------------------------------------------

    async def serve(self, call: PendingCall, sink: Sink) -> None:
        """Serve `call` into `sink`. Never raises for backend or client failures: they are recorded."""
        conv, dialect = call.conversation, call.dialect
        start = call.start
        try:
            if len(start.request_body) > INLINE_RENDER_CHARS:  # the request's size bounds the prompt's
                prompt = await asyncio.to_thread(self.renderer.render, conv)
            else:
                prompt = self.renderer.render(conv)
        except Exception as e:  # a template that cannot render this conversation
            msg = f"The chat template could not render this request: {e}"
            await self.record_failure(start, status="failed", error=msg, http_status=400)
            await respond(sink, 400, JSON_HEADERS, dialect.error(400, msg, "render_error"))
            return
        start.prompt_ids = prompt.ids
        start.backend = self.backend.url
        start.backend_kind = self.backend.kind
        try:
            call_id, _seq = await self.store.begin_call(start)
        except Exception as e:
            log.error("store write failed: %s", e)
            msg = f"polarproxy cannot write to its store, so it will not serve unrecorded calls: {e}"
            await respond(sink, 503, JSON_HEADERS, dialect.error(503, msg, "store_unavailable"))
            return
        run = _CallRun(self, call, call_id, prompt.ids, sink)
        try:
            if conv.stream:
                await run.stream()
            else:
                await run.complete()
        except asyncio.CancelledError:
            await asyncio.shield(run.record_abort("aborted: the harness disconnected before the answer was complete"))
            raise
        except ClientGone:
            await run.record_abort("aborted: the harness disconnected before the answer was complete")
        except Exception as e:  # a bug must still answer the harness and leave a record
            log.exception("internal error while serving call %s", call_id)
            await run.internal_error(e)

    async def record_failure(self, start: CallStart, *, status: str, error: str, http_status: int) -> None:
        try:
            call_id, _ = await self.store.begin_call(start)
            await self.store.finish_call(
                call_id,
                CallResult(status=status, error=error, http_status=http_status, ended_at=time.time()),  # type: ignore[arg-type]
            )
        except Exception as e:
            log.error("store write failed while recording a failed call: %s", e)


class _CallRun:
    """The state of one call being served."""

    def __init__(self, gw: Gateway, call: PendingCall, call_id: str, prompt_ids: list[int], sink: Sink) -> None:
        self.gw = gw
        self.call = call
        self.call_id = call_id
        self.prompt_ids = prompt_ids
        self.sink = sink
        self.dialect = call.dialect
        self.response_id = "chatcmpl-" + call_id.removeprefix("call_")
        self.created = int(time.time())
        self.model = call.conversation.model or self.gw.renderer.model_dir.name
        self.gen: Generation | None = None
        self.first_token_at: float | None = None
        self.finished = False
        self.started = False
        self.body_parts: list[bytes] = []

    def _latency(self) -> tuple[float, float | None]:
        now = time.perf_counter()
        latency = (now - self.call.received) * 1000
        ttft = (self.first_token_at - self.call.received) * 1000 if self.first_token_at else None
        return latency, ttft

    def _result(self, status: str, **kw: object) -> CallResult:
        gen = self.gen
        latency, ttft = self._latency()
        return CallResult(
            status=status,  # type: ignore[arg-type]
            output_ids=list(gen.output_ids) if gen else [],
            output_logprobs=list(gen.logprobs) if gen else [],
            weight_version=gen.weight_version if gen else None,
            latency_ms=latency,
            ttft_ms=ttft,
            ended_at=time.time(),
            prompt_tokens=len(self.prompt_ids),
            completion_tokens=len(gen.output_ids) if gen else 0,
            **kw,  # type: ignore[arg-type]
        )

    async def _finish(self, result: CallResult) -> None:
        self.finished = True
        await self.gw.store.finish_call(self.call_id, result)

    async def record_abort(self, reason: str) -> None:
        if not self.finished:
            try:
                await self._finish(self._result("aborted", error=reason, http_status=499))
            except Exception as e:
                log.error("store write failed while recording an aborted call: %s", e)

    async def _send(self, data: bytes) -> None:
        if not data:
            return
        self.body_parts.append(data)
        try:
            await self.sink.send(data)
        except (ConnectionError, OSError) as e:
            raise ClientGone(str(e)) from e

    async def _backend_failed(self, e: BackendError, started: bool) -> None:
        msg = e.message
        if started:
            partial = self.gw_stream_error(msg, e.kind)
            await self._finish(self._result("failed", error=f"{e.kind}: {msg}", http_status=200,
                                            response_body=b"".join(self.body_parts + [partial]).decode()))
            await self._send(partial)
            await self._end()
        else:
            status = e.status if e.status >= 400 else 502
            body = self.dialect.error(status, msg, e.kind)
            await self._finish(self._result("failed", error=f"{e.kind}: {msg}", http_status=status,
                                            response_body=body.decode()))
            await self._respond(status, JSON_HEADERS, body)

    def gw_stream_error(self, msg: str, kind: str) -> bytes:
        return self._writer.error(msg, kind)

    async def internal_error(self, e: Exception) -> None:
        if self.finished:
            return
        msg = f"polarproxy internal error: {e!r}"
        with contextlib.suppress(Exception):
            await self._finish(self._result("failed", error=msg, http_status=500))
        with contextlib.suppress(Exception):
            if self.started:
                await self._send(self._writer.error(msg, "internal_error"))
                await self._end()
            else:
                await self._respond(500, JSON_HEADERS, self.dialect.error(500, msg, "internal_error"))

    async def _end(self) -> None:
        try:
            await self.sink.end()
        except (ConnectionError, OSError) as e:
            raise ClientGone(str(e)) from e

    async def _respond(self, status: int, headers: dict[str, str], body: bytes) -> None:
        try:
            await respond(self.sink, status, headers, body)
        except (ConnectionError, OSError) as e:
            raise ClientGone(str(e)) from e

    def _usage(self) -> Usage:
        gen = self.gen
        return Usage(prompt_tokens=len(self.prompt_ids), completion_tokens=len(gen.output_ids) if gen else 0)

    async def complete(self) -> None:
        gw = self.gw
        params = gw.params(self.call.conversation)
        try:
            async for gen in gw.backend.generate(self.prompt_ids, params, stream=False):
                self.gen = gen
        except BackendError as e:
            await self._backend_failed(e, started=False)
            return
        gen = self.gen
        assert gen is not None and gen.finish_reason is not None
        self.first_token_at = time.perf_counter()
        trimmer = StopTrimmer(params.stop)
        text = trimmer.push(gw.renderer.decode(gw._text_ids(gen, gen.output_ids)))
        text += trimmer.finish(gen.matched_stop)
        parser = OutputParser(new_call_id=new_tool_call_id)
        parser.feed(text)
        _, completion = parser.finish(_finish_reason(gen), self._usage())
        body = self.dialect.response(completion, response_id=self.response_id, model=self.model, created=self.created)
        await self._finish(self._ok_result(completion, body))
        await self._respond(200, JSON_HEADERS, body)

    def _ok_result(self, completion: Completion, body: bytes) -> CallResult:
        gen = self.gen
        assert gen is not None
        return self._result(
            "ok",
            http_status=200,
            response_body=body.decode(),
            completion=completion.to_dict(),
            finish_reason=completion.finish_reason,
        )

    async def stream(self) -> None:
        gw = self.gw
        conv = self.call.conversation
        params = gw.params(conv)
        self._writer = self.dialect.stream_writer(
            conv, response_id=self.response_id, model=self.model, created=self.created
        )
        detok = IncrementalDetokenizer(gw.renderer.decode)
        trimmer = StopTrimmer(params.stop)
        parser = OutputParser(new_call_id=new_tool_call_id)
        started = False
        keepalive: asyncio.Task[None] | None = None
        self._last_send = time.monotonic()
        try:
            async for gen in gw.backend.generate(self.prompt_ids, params, stream=True):
                self.gen = gen
                if not started:
                    self.first_token_at = time.perf_counter()
                    try:
                        await self.sink.head(200, SSE_HEADERS)
                    except (ConnectionError, OSError) as e:
                        raise ClientGone(str(e)) from e
                    started = self.started = True
                    await self._send(self._writer.start())
                    keepalive = asyncio.create_task(self._keepalive())
                text = detok.push(gw._text_ids(gen, gen.new_ids))
                if gen.finish_reason is not None:
                    text += detok.flush()
                    text = trimmer.push(text) + trimmer.finish(gen.matched_stop)
                else:
                    text = trimmer.push(text)
                if text:
                    events = parser.feed(text)
                    if events:
                        await self._send(self._writer.events(events))
                        self._last_send = time.monotonic()
        except BackendError as e:
            if keepalive:
                keepalive.cancel()
            await self._backend_failed(e, started)
            return
        finally:
            if keepalive:
                keepalive.cancel()
        gen = self.gen
        assert gen is not None and gen.finish_reason is not None
        events, completion = parser.finish(_finish_reason(gen), self._usage())
        tail = self._writer.events(events) + self._writer.finish(completion)
        body = b"".join(self.body_parts) + tail
        await self._finish(self._ok_result(completion, body))  # T6: on disk before the last bytes go out
        await self._send(tail)
        await self._end()

    async def _keepalive(self) -> None:
        interval = self.gw.options.keepalive_s
        while True:
            await asyncio.sleep(interval)
            if time.monotonic() - self._last_send >= interval:
                try:
                    await self.sink.send(self._writer.keepalive())
                except (ConnectionError, OSError):
                    return
                self._last_send = time.monotonic()


def _finish_reason(gen: Generation) -> str:
    return {"stop": "stop", "length": "length"}.get(gen.finish_reason or "", "stop")

