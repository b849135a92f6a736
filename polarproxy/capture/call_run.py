"""One harness call being served (gateway mode): its record, its response, its failures.

`Gateway.serve` (capture/gateway.py) renders the prompt and begins the record, then hands the call to a
`CallRun`, which asks the backend for tokens and answers in one of two ways: a whole answer (`complete`) or
a stream of the parsed answer as tokens arrive (`stream`). Nothing reaches the harness before its call is
on disk, and the finished record is committed before the last bytes go out (T6); every failure (backend,
store, a harness that hangs up, a bug) is recorded and answered in the harness's own error shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from array import array
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Protocol

from polarproxy.backends.base import Backend, BackendError, GenerateParams, Generation
from polarproxy.conversation import Completion, FinishReason, Usage
from polarproxy.dialects.base import StreamWriter, answer_signature
from polarproxy.render.decoder import OutputDecoder
from polarproxy.render.prefix import Turn
from polarproxy.store.arrays import int32_array
from polarproxy.store.records import CallResult

if TYPE_CHECKING:
    from polarproxy.capture.gateway import Gateway, PendingCall

log = logging.getLogger("polarproxy.gateway")

JSON_HEADERS = {"content-type": "application/json"}


def random_id() -> str:
    """24 random hex characters (one read of the OS's random source)."""
    return secrets.token_hex(12)


class ClientGone(Exception):
    """The harness hung up before the answer was complete."""


class Sink(Protocol):
    """Where a response goes: through mitmproxy to the harness (capture/responder.py)."""

    async def head(self, status: int, headers: dict[str, str]) -> None: ...

    async def send(self, data: bytes) -> None: ...

    async def end(self) -> None: ...

    def send_nowait(self, data: bytes) -> None:
        """Queue bytes without waiting for the peer (keep-alives from a timer)."""
        ...

    def prepare_head(self, status: int, headers: dict[str, str]) -> None:
        """The head this answer will most likely begin with, told while the backend computes the first
        token, so that a sink can make it ahead (`head` with other values still works). Nothing is sent."""
        return None


async def respond(sink: Sink, status: int, headers: dict[str, str], body: bytes) -> None:
    await sink.head(status, {**headers, "content-length": str(len(body))})
    await sink.send(body)
    await sink.end()


class StoreUnavailable(Exception):
    """The store could not be written: the call is not served further (nothing goes out unrecorded)."""


class CallRun:
    """The state of one call being served."""

    def __init__(
        self,
        gw: Gateway,
        call: PendingCall,
        begin: asyncio.Future[tuple[str, int]] | None,  # None: begun at the first call_id() (chat mode)
        prompt_ids: Sequence[int],  # an int32 array (Prompt.tokens), or the server's list in chat mode
        sink: Sink,
    ) -> None:
        self.gw = gw
        self.call = call
        self.begin = begin
        self.prompt_ids = prompt_ids
        self.sink = sink
        self.dialect = call.dialect
        self.response_id = random_id()  # the dialect adds its prefix (chatcmpl-, msg_, resp_, ...)
        self.created = int(time.time())
        self.model = call.conversation.model or self.gw.renderer.model_dir.name
        self.gen: Generation | None = None
        self.first_token_at: float | None = None
        self.finished = False
        self.started = False  # response head sent
        self.body_parts: list[bytes] = []
        self._writer: StreamWriter | None = None
        self._decoder: OutputDecoder | None = None  # a stream's (`stream`)
        self._last_send = 0.0
        self._keepalive: asyncio.TimerHandle | None = None

    # -- the record -----------------------------------------------------------------------------

    async def call_id(self) -> str:
        if self.begin is None:
            self.begin = asyncio.ensure_future(self.gw.store.begin_call(self.call.start))
        try:
            return (await self.begin)[0]
        except Exception as e:
            raise StoreUnavailable(str(e)) from e

    def _result(self, status: str, **kw: object) -> CallResult:
        gen = self.gen
        now = time.perf_counter()
        return CallResult(
            status=status,  # type: ignore[arg-type]
            output_ids=list(gen.output_ids) if gen else [],
            output_logprobs=list(gen.logprobs) if gen else [],
            weight_version=gen.weight_version if gen else None,
            # first and last chunk's versions: they differ when the weights changed mid-call
            weight_version_first=gen.weight_version_first if gen else None,
            weight_version_last=gen.weight_version if gen else None,
            latency_ms=(now - self.call.received) * 1000,
            ttft_ms=(self.first_token_at - self.call.received) * 1000 if self.first_token_at else None,
            ended_at=time.time(),
            prompt_tokens=len(self.prompt_ids),
            completion_tokens=len(gen.output_ids) if gen else 0,
            **kw,  # type: ignore[arg-type]
        )

    async def _finish(self, result: CallResult) -> None:
        call_id = await self.call_id()
        first, last = result.weight_version_first, result.weight_version_last
        if first is not None and last is not None and first != last:
            log.warning("call %s was sampled by two weight versions (%s, then %s)", call_id, first, last)
        try:
            await self.gw.store.finish_call(call_id, result)
        except Exception as e:
            raise StoreUnavailable(str(e)) from e
        self.finished = True

    async def record_abort(self, reason: str) -> None:
        self._stop_keepalive()
        if not self.finished:
            try:
                await self._finish(self._result("aborted", error=reason, http_status=499))
            except Exception as e:
                log.error("store write failed while recording an aborted call: %s", e)

    # -- the response ---------------------------------------------------------------------------

    async def _head(self, status: int, headers: dict[str, str]) -> None:
        await self.call_id()  # nothing reaches the harness before its call is on disk
        try:
            await self.sink.head(status, headers)
        except (ConnectionError, OSError) as e:
            raise ClientGone(str(e)) from e
        self.started = True

    async def _send(self, data: bytes) -> None:
        if not data:
            return
        self.body_parts.append(data)
        try:
            await self.sink.send(data)
        except (ConnectionError, OSError) as e:
            raise ClientGone(str(e)) from e
        self._last_send = time.monotonic()

    async def _end(self) -> None:
        self._stop_keepalive()
        try:
            await self.sink.end()
        except (ConnectionError, OSError) as e:
            raise ClientGone(str(e)) from e

    async def _respond(self, status: int, body: bytes) -> None:
        await self._head(status, {**JSON_HEADERS, "content-length": str(len(body))})
        await self._send(body)
        await self._end()

    def _error_bytes(self, status: int, msg: str, code: str) -> bytes:
        """How an error ends this response: an error event mid-stream, else a provider error body.
        Built once per error: the record keeps exactly the bytes that are sent."""
        if self.started and self._writer is not None:
            return self._writer.error(msg, code)
        return self.dialect.error(status, msg, code)

    async def _send_error(self, status: int, data: bytes) -> None:
        if self.started:
            await self._send(data)
            await self._end()
        else:
            await self._respond(status, data)

    def _arm_keepalive(self) -> None:
        interval = self.gw.options.keepalive_s
        self._keepalive = asyncio.get_running_loop().call_later(interval, self._tick_keepalive)

    def _tick_keepalive(self) -> None:
        """A comment line when nothing was sent for a while, so clients and middleboxes keep the stream."""
        if (
            self._writer is not None
            and time.monotonic() - self._last_send >= self.gw.options.keepalive_s * 0.9
        ):
            try:
                self.sink.send_nowait(self._writer.keepalive())
            except (ConnectionError, OSError):
                return
            self._last_send = time.monotonic()
        self._arm_keepalive()

    def _stop_keepalive(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None

    # -- failures -------------------------------------------------------------------------------

    async def _backend_failed(self, e: BackendError) -> None:
        status = e.status if e.status >= 400 else 502
        data = self._error_bytes(status, e.message, e.kind)
        body = b"".join([*self.body_parts, data]) if self.started else data
        await self._finish(
            self._result(
                "failed",
                error=f"{e.kind}: {e.message}",
                http_status=200 if self.started else status,
                response_body=body.decode(),
            )
        )
        await self._send_error(status, data)

    async def store_failed(self, e: StoreUnavailable) -> None:
        self._stop_keepalive()
        log.error("store write failed: %s", e)
        msg = f"polarproxy cannot write to its store, so it will not serve unrecorded calls: {e}"
        with contextlib.suppress(ClientGone, StoreUnavailable):
            # the head is not sent without a record, so go straight to the sink
            if self.started and self._writer is not None:
                await self._send(self._writer.error(msg, "store_unavailable"))
                await self._end()
            else:
                await respond(self.sink, 503, JSON_HEADERS, self.dialect.error(503, msg, "store_unavailable"))

    async def internal_error(self, e: Exception) -> None:
        self._stop_keepalive()
        if self.finished:
            return
        msg = f"polarproxy internal error: {e!r}"
        with contextlib.suppress(Exception):
            await self._finish(self._result("failed", error=msg, http_status=500))
        with contextlib.suppress(Exception):
            await self._send_error(500, self._error_bytes(500, msg, "internal_error"))

    # -- the two ways of answering --------------------------------------------------------------

    def _usage(self) -> Usage:
        gen = self.gen
        return Usage(prompt_tokens=len(self.prompt_ids), completion_tokens=len(gen.output_ids) if gen else 0)

    async def _finish_ok(self, completion: Completion, body: bytes) -> None:
        """Commit the finished record (T6), then let later calls of the episode extend this one (T2)."""
        await self._finish(self._ok_result(completion, body))
        gen = self.gen
        assert gen is not None
        if is_chat_mode(self.gw.backend):
            return  # server-rendered prompts are not extended (T2 does not hold in chat mode)
        closing = None
        if (
            gen.finish_reason == "stop"
            and gen.output_ids
            and gen.output_ids[-1] in self.gw.renderer.stop_token_ids
        ):
            closing = self.gw.renderer.token_text(gen.output_ids[-1])
        self.gw.prefixes.remember(
            self.call.episode_id,
            Turn(
                call_id=await self.call_id(),
                conversation=self.call.conversation,
                completion=completion,
                prompt_ids=int32_array(self.prompt_ids),
                output_ids=array("i", gen.output_ids),
                closing_text=closing,
                fold=self.call.prompt_fold,
            ),
        )

    def _ok_result(self, completion: Completion, body: bytes) -> CallResult:
        return self._result(
            "ok",
            http_status=200,
            response_body=body.decode(),
            completion=completion.to_dict(),
            finish_reason=completion.finish_reason,
        )

    async def _generate(self, params: GenerateParams, *, stream: bool) -> AsyncIterator[Generation]:
        """The backend's updates. In chat mode the server renders the conversation, and the prompt IDs it
        reports become this call's (before its record is begun)."""
        backend = self.gw.backend
        if not is_chat_mode(backend):
            async for gen in backend.generate(self.prompt_ids, params, stream=stream):
                yield gen
            return
        async for gen in backend.generate_chat(self.call.conversation, params, stream=stream):  # type: ignore[attr-defined]
            if gen.prompt_ids is not None and self.begin is None:
                self.prompt_ids = self.call.start.prompt_ids = list(gen.prompt_ids)
            elif gen.prompt_ids is not None and gen.prompt_ids != self.prompt_ids:
                raise BackendError(
                    f"Backend {backend.url} reported its prompt token IDs only after the answer had started; "
                    "chat mode needs them in the first chunk (vLLM's return_token_ids does this)."
                )
            yield gen

    async def complete(self) -> None:
        gw = self.gw
        params = gw.params(self.call.conversation, self.call.start.sampling_sent)
        try:
            async for gen in self._generate(params, stream=False):
                self.gen = gen
        except BackendError as e:
            await self._backend_failed(e)
            return
        gen = self.gen
        assert gen is not None and gen.finish_reason is not None
        self.first_token_at = time.perf_counter()
        decoder = gw.decoder(self.call.conversation, self.prompt_ids, params.stop)
        decoder.push(gw.shown_ids(gen, gen.output_ids))
        _, completion = decoder.flush(_finish_reason(gen), self._usage(), gen.matched_stop)
        completion.signature = answer_signature(self.response_id)
        body = self.dialect.response(
            completion, response_id=self.response_id, model=self.model, created=self.created
        )
        await self._finish_ok(completion, body)
        await self._respond(200, body)

    def _prepare_stream(self, stops: list[str], head: dict[str, str]) -> None:
        """The output decoder (unless chat mode, where the prompt IDs come with the first chunk) and the
        stream's likely head, made while the backend computes the first token."""
        if self._decoder is None and not is_chat_mode(self.gw.backend):
            with contextlib.suppress(Exception):  # else made at the first chunk, where a failure is answered
                self._decoder = self.gw.decoder(self.call.conversation, self.prompt_ids, stops)
        if not self.started:
            self.sink.prepare_head(200, head)

    async def stream(self) -> None:
        gw = self.gw
        conv = self.call.conversation
        params = gw.params(conv, self.call.start.sampling_sent)
        writer = self._writer = self.dialect.stream_writer(
            conv,
            response_id=self.response_id,
            model=self.model,
            created=self.created,
            prompt_tokens=len(self.prompt_ids),
        )
        head = {"content-type": writer.content_type, "cache-control": "no-cache"}
        # What the first chunk needs is made while the backend computes it: this runs once the request is
        # sent (the task's first wait) and before any chunk is read.
        ahead = asyncio.get_running_loop().call_soon(self._prepare_stream, params.stop, head)
        try:
            async for gen in self._generate(params, stream=True):
                self.gen = gen
                if self._decoder is None:  # chat mode (prompt IDs come with this chunk), or none ahead
                    self._decoder = gw.decoder(conv, self.prompt_ids, params.stop)
                events = self._decoder.push(gw.shown_ids(gen, gen.new_ids))
                if not self.started:  # the stream's opening and its first content go out as one write
                    self.first_token_at = time.perf_counter()
                    await self._head(200, head)
                    await self._send(writer.start() + (writer.events(events) if events else b""))
                    self._arm_keepalive()
                elif events:
                    await self._send(writer.events(events))
        except BackendError as e:
            self._stop_keepalive()
            await self._backend_failed(e)
            return
        finally:
            ahead.cancel()
        self._stop_keepalive()
        gen, decoder = self.gen, self._decoder
        assert gen is not None and gen.finish_reason is not None and decoder is not None
        events, completion = decoder.flush(_finish_reason(gen), self._usage(), gen.matched_stop)
        completion.signature = answer_signature(self.response_id)
        tail = writer.events(events) + writer.finish(completion)
        await self._finish_ok(completion, b"".join([*self.body_parts, tail]))  # T6: on disk first
        await self._send(tail)
        await self._end()


def is_chat_mode(backend: Backend) -> bool:
    """Whether the backend renders prompts itself (`--backend-mode chat`)."""
    return getattr(backend, "mode", "tokens") == "chat"


def _finish_reason(gen: Generation) -> FinishReason:
    return "length" if gen.finish_reason == "length" else "stop"
