"""Serve one harness call from the backend, token-faithfully, and record it (gateway mode).

Per call: render the conversation to prompt IDs (extending the episode's earlier call, T2), refuse what
cannot fit the model's context, and record the call as in flight; then a `CallRun` (capture/call_run.py)
asks the backend for tokens, streams the parsed answer back in the harness's dialect as tokens arrive, and
commits the finished record before the last bytes (finish reason, usage, terminator) go out (T6). Every
failure path records the call with its status and reason, and answers the harness with a provider-shaped
error.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from polarproxy.backends.base import Backend, GenerateParams, Generation
from polarproxy.capture.bodies import MAX_BODY_BYTES
from polarproxy.capture.call_run import (
    JSON_HEADERS,
    CallRun,
    ClientGone,
    Sink,
    StoreUnavailable,
    is_chat_mode,
    random_id,
    respond,
)
from polarproxy.capture.sampling import sent_sampling
from polarproxy.conversation import Conversation
from polarproxy.dialects.base import Dialect
from polarproxy.logprob_semantics import logprob_temperature
from polarproxy.render.decoder import OutputDecoder, output_decoder
from polarproxy.render.family import (
    OutputFormat,
    check_reasoning_format,
    check_tool_format,
    tokenizer_output_format,
)
from polarproxy.render.prefix import PrefixIndex
from polarproxy.render.renderer import Renderer
from polarproxy.store.records import CallResult, CallStart

log = logging.getLogger("polarproxy.gateway")

ABORTED = "aborted: the harness disconnected before the answer was complete"  # a call's error then
STOPPED = "aborted: the proxy stopped before the answer was complete"  # a call's error when it stops
STOPPING = "polarproxy: the proxy stops"  # the message of the cancellation that stops a call being served
# Prompts that render more than this many characters of messages (a fresh render of a long request, an
# extension with long new messages, a whole-conversation check) are made in a worker thread (the tokenizer
# releases the GIL there), so one long request does not hold up the streams of the others; the rest, an
# extension of any length with short new messages among them, are cheaper inline.
INLINE_RENDER_CHARS = 16_384


def new_tool_call_id() -> str:
    return "call_" + random_id()


def _abort_reason(e: asyncio.CancelledError) -> str:
    """A cancelled call's recorded error: the proxy stopping (`Responder.stop` cancels with `STOPPING`), or
    else the harness hanging up."""
    return STOPPED if e.args and e.args[0] == STOPPING else ABORTED


@dataclass(slots=True)
class PendingCall:
    """A parsed harness request waiting to be served."""

    flow_id: str
    episode_id: str
    dialect: Dialect
    conversation: Conversation
    start: CallStart  # request side of the record, already redacted
    received: float = field(default_factory=time.perf_counter)
    prompt_fold: str | None = None  # the fold its prompt needed (T2 renders continuations the same way)
    # its episode's own sampling values (`sampling` of POST /polarproxy/v1/episodes), over the flags'
    sampling: dict[str, Any] | None = None


@dataclass(slots=True)
class GatewayOptions:
    max_tokens_default: int = 4096
    keepalive_s: float = 15.0
    # None: detected from the chat template (render/family.py)
    tool_format: str | None = None  # hermes | qwen-xml | llama-json | deepseek | mistral | harmony
    reasoning_format: str | None = None  # think | none
    prefix_policy: str = "extend"  # extend (T2) | fresh (every call rendered as the template does)
    max_body_bytes: int = MAX_BODY_BYTES  # `--max-body-bytes`: a request body's bound, after decompression
    # `--temperature --top-p --top-k --sampling-policy`: the gateway owns the sampling parameters (below)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    sampling_policy: str = "harness"  # harness: a value the harness sends wins | override: the flag wins
    # `--backend-logprobs scaled|raw`: what the backend's logprobs are; None: its kind's default
    backend_logprobs: str | None = None


MAX_TOOLS = 1024  # tools one request may offer (real harnesses offer 4-30)
CHARS_PER_TOKEN_BOUND = 64  # no token of a byte-level vocabulary covers more characters than this


class StoreLike(Protocol):
    async def begin_call(self, start: CallStart) -> tuple[str, int]: ...

    async def finish_call(self, call_id: str, result: CallResult) -> None: ...


class Gateway:
    def __init__(
        self, *, renderer: Renderer, backend: Backend, store: StoreLike, options: GatewayOptions | None = None
    ) -> None:
        self.renderer = renderer
        self.backend = backend
        self.store = store
        self.options = options or GatewayOptions()
        self.prefixes = PrefixIndex(renderer, policy=self.options.prefix_policy)
        if self.options.tool_format is not None:  # refused at start, before the tokenizer is read
            check_tool_format(self.options.tool_format)
        if self.options.reasoning_format is not None:
            check_reasoning_format(self.options.reasoning_format)
        if renderer.loaded:
            _ = self.output_format  # a loaded tokenizer: its formats are known now

    @functools.cached_property
    def output_format(self) -> OutputFormat:
        """How this model writes reasoning and tool calls (render/family.py), unless the options say; read
        from the tokenizer at the first call (a deferred one is loaded by then, `serve`)."""
        return tokenizer_output_format(
            self.renderer.tokenizer,
            tool_format=self.options.tool_format,
            reasoning_format=self.options.reasoning_format,
        )

    # -- parameters -----------------------------------------------------------------------------

    def params(self, conv: Conversation, sent: dict[str, Any] | None = None) -> GenerateParams:
        """The backend's parameters for a call; `sent`: its `sent_sampling` (None: the flags')."""
        s = conv.sampling
        sent = sent if sent is not None else sent_sampling(s, self.options)
        return GenerateParams(
            max_new_tokens=s.max_tokens if s.max_tokens is not None else self.options.max_tokens_default,
            temperature=sent["temperature"],
            top_p=sent["top_p"],
            top_k=sent["top_k"],
            stop=list(s.stop),
            stop_token_ids=list(self.renderer.stop_token_ids),
            seed=s.seed,
        )

    def decoder(self, conv: Conversation, prompt_ids: Sequence[int], stops: list[str]) -> OutputDecoder:
        """One call's output decoder: detokenizer, stop trimming and this model's parser, composed."""
        return output_decoder(
            self.renderer.decode,
            self.output_format,
            stops=stops,
            tools=conv.tools,
            new_call_id=new_tool_call_id,
            prompt_tail=self.renderer.decode(list(prompt_ids[-4:])),
        )

    def shown_ids(self, gen: Generation, ids: list[int]) -> list[int]:
        """The new IDs that become text: a matched stop token is kept in the record, not shown."""
        if gen.finish_reason == "stop" and ids and gen.output_ids and ids[-1] == gen.output_ids[-1]:
            last = gen.output_ids[-1]
            if last in self.renderer.stop_token_ids or last == gen.matched_stop:
                return ids[:-1]
        return ids

    # -- serving --------------------------------------------------------------------------------

    async def serve(self, call: PendingCall, sink: Sink) -> None:
        """Serve `call` into `sink`. Never raises for backend, store or client failures: they are recorded."""
        conv, dialect = call.conversation, call.dialect
        start = call.start
        start.backend = self.backend.url
        start.backend_kind = self.backend.kind
        # recorded: what was sent, by whom
        start.sampling_sent = sent_sampling(conv.sampling, self.options, call.sampling)
        start.temperature = start.sampling_sent["temperature"]
        start.top_p, start.top_k = start.sampling_sent["top_p"], start.sampling_sent["top_k"]
        start.logprob_temperature = logprob_temperature(
            self.backend.kind, start.temperature, self.options.backend_logprobs
        )
        begin: asyncio.Future[tuple[str, int]] | None = None
        if not self.renderer.loaded:  # a deferred tokenizer (Renderer(defer=True)) still loading
            try:
                await self.renderer.ready()
            except asyncio.CancelledError as e:  # the harness hung up, or the proxy stops: T3, recorded
                await asyncio.shield(
                    self.record_failure(start, status="aborted", error=_abort_reason(e), http_status=499)
                )
                raise
            except Exception as e:
                msg = f"The proxy cannot serve: {e}"
                await self.record_failure(start, status="failed", error=msg, http_status=500)
                await respond(sink, 500, JSON_HEADERS, dialect.error(500, msg, "tokenizer_error"))
                return
        too_long = self._over_context(conv, start.request_body, None)
        if too_long is not None:  # refused before tokenizing: a character bound no prompt that fits can pass
            await self.record_failure(start, status="failed", error=too_long, http_status=400)
            await respond(sink, 400, JSON_HEADERS, dialect.error(400, too_long, "context_length_exceeded"))
            return
        if is_chat_mode(self.backend):
            # The server renders the prompt and reports its IDs; the record is begun once they are known.
            start.fidelity, start.render_mode = "server-rendered", "server"
            prompt_ids: Sequence[int] = []
        else:
            try:
                if len(start.request_body) <= INLINE_RENDER_CHARS:  # the request's size bounds the prompt's
                    prompt = self.prefixes.build(call.episode_id, conv)
                else:
                    built = self.prefixes.build_within(call.episode_id, conv, INLINE_RENDER_CHARS)
                    prompt = built or await asyncio.to_thread(self.prefixes.build, call.episode_id, conv)
            except Exception as e:  # a template that cannot render this conversation
                msg = f"The chat template could not render this request: {e}"
                await self.record_failure(start, status="failed", error=msg, http_status=400)
                await respond(sink, 400, JSON_HEADERS, dialect.error(400, msg, "render_error"))
                return
            too_long = self._over_context(conv, "", len(prompt.tokens))
            if too_long is not None:  # the backend would refuse it after a prefill's worth of work
                start.prompt_ids = prompt.tokens  # the refused prompt is kept with the record
                await self.record_failure(start, status="failed", error=too_long, http_status=400)
                await respond(
                    sink, 400, JSON_HEADERS, dialect.error(400, too_long, "context_length_exceeded")
                )
                return
            prompt_ids = start.prompt_ids = prompt.tokens
            start.render_mode = prompt.mode  # type: ignore[assignment]
            start.extended_from = prompt.extended_from
            # T2: the prompt is that call's whole prompt + output + new tokens; the store keeps only the new
            # ones (after checking them), so an episode's token storage grows linearly.
            start.prompt_base_call_id, start.prompt_base_len = prompt.extended_from, None
            start.render_note = prompt.record_note()
            call.prompt_fold = prompt.fold
            # The in-flight record is written while the backend works; it must be on disk before the first
            # byte goes to the harness, and the finished record before the last (T6).
            begin = asyncio.ensure_future(self.store.begin_call(start))
        run = CallRun(self, call, begin, prompt_ids, sink)
        try:
            if conv.stream:
                await run.stream()
            else:
                await run.complete()
        except asyncio.CancelledError as e:
            await asyncio.shield(run.record_abort(_abort_reason(e)))
            raise
        except ClientGone:
            await run.record_abort(ABORTED)
        except StoreUnavailable as e:
            await run.store_failed(e)
        except Exception as e:  # a bug must still answer the harness and leave a record
            log.exception("internal error while serving a call")
            await run.internal_error(e)

    def _over_context(self, conv: Conversation, body: str, prompt_tokens: int | None) -> str | None:
        """Why this request cannot fit the model's context (None: it may): before tokenizing, a body of more
        than CHARS_PER_TOKEN_BOUND characters per token of context (no token covers more); after, its
        prompt's tokens plus one to sample; and a tools list over MAX_TOOLS."""
        if len(conv.tools) > MAX_TOOLS:
            return f"The request offers {len(conv.tools)} tools; polarproxy takes at most {MAX_TOOLS}."
        context = self.renderer.context_length
        if context is None:
            return None
        if prompt_tokens is None and len(body) > context * CHARS_PER_TOKEN_BOUND:
            return (
                f"The request is {len(body)} characters: more than the model's context length of {context} "
                "tokens can hold (it was not tokenized)."
            )
        if prompt_tokens is not None and prompt_tokens >= context:
            return f"The prompt is {prompt_tokens} tokens; the model's context length is {context} tokens."
        return None

    async def record_failure(self, start: CallStart, *, status: str, error: str, http_status: int) -> None:
        try:
            call_id, _ = await self.store.begin_call(start)
            await self.store.finish_call(
                call_id,
                CallResult(status=status, error=error, http_status=http_status, ended_at=time.time()),  # type: ignore[arg-type]
            )
        except Exception as e:
            log.error("store write failed while recording a failed call: %s", e)
