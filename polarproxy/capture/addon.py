"""The mitmproxy addon: route harness requests to the gateway, record every call (gateway mode).

Load it with `mitmdump -s addons/polarproxy_recorder.py --mode reverse:http://BACKEND --set
polarproxy_model=DIR`, or let `polarproxy record` / `polarproxy serve` run it in process. A request on a
known provider route is parsed here (a malformed one is answered with a provider-shaped 4xx and recorded
as failed) and its serving begins in this hook: a non-streamed call is answered from here, a streamed
one is pointed at the responder, whose answer streams back through mitmproxy's HTTP layer (in process:
capture/inprocess.py). Anything else gets a provider-shaped 404; nothing reaches the backend unrecorded.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from mitmproxy import ctx, exceptions, http
from mitmproxy.connection import ConnectionState

from polarproxy.capture import inprocess
from polarproxy.capture.bodies import BodyError, check_depth, read_body, too_large
from polarproxy.capture.call_run import JSON_HEADERS
from polarproxy.capture.gateway import Gateway, PendingCall
from polarproxy.capture.responder import Responder
from polarproxy.dialects import OPENAI_CHAT, DialectError, route, served_routes
from polarproxy.dialects.resend import ResentBodies
from polarproxy.redact import redact_headers, redact_path
from polarproxy.store.ids import EPISODE_ID, invalid_episode_header
from polarproxy.store.records import CallStart, EpisodeStart
from polarproxy.store.writer import StoreWriter

if TYPE_CHECKING:
    from polarproxy.capture.stack import ProxyConfig, Stack

log = logging.getLogger("polarproxy.addon")

EPISODE_HEADER = "x-polarproxy-episode"
_EPISODE_PATH = re.compile(f"^/e/({EPISODE_ID})(/.*)$")
META_KEY = "polarproxy.flow"
CONTROL_PREFIX = "/polarproxy/"  # polarproxy's own routes (rewards); never a provider route
REWARD_ROUTE = "/polarproxy/v1/episodes/{id}/reward"
_REWARD_PATH = re.compile(f"^/polarproxy/v1/episodes/({EPISODE_ID})/reward/?$")


class Refused(Protocol):
    """Why a harness call is not served: the status, message and code of its dialect's error shape."""

    @property
    def status(self) -> int: ...
    @property
    def message(self) -> str: ...
    @property
    def code(self) -> str: ...


class ControlAPI(Protocol):
    """What the recorder needs of `serve`'s control API (control/api.py): routing a harness call to its
    episode, and answering the control routes."""

    async def episode_for(
        self, req: http.Request, named: str | None, from_path: bool
    ) -> str | Refused | None: ...

    async def answer(self, flow: http.HTTPFlow) -> bool: ...

    async def sampling_for(self, episode_id: str) -> dict[str, Any] | None: ...


class Recorder:
    """mitmproxy addon. Build it with a ready `gateway` (in process) or configure it with options."""

    def __init__(
        self,
        *,
        gateway: Gateway | None = None,
        writer: StoreWriter | None = None,
        default_episode: str | None = None,
        model_name: str | None = None,
    ) -> None:
        self.gateway = gateway
        self.writer = writer
        self.default_episode = default_episode
        # what the default episode starts with when its first call creates it (`serve`); None: it exists
        self.default_start: EpisodeStart | None = None
        self.model_name = model_name
        self._injected = gateway is not None
        self.responder: Responder | None = None
        # `serve`'s control API and episode routing (control/api.py); None: `record` and mitmdump
        self.control: ControlAPI | None = None
        # mitmdump: the options' configuration, and the stack built from it once mitmproxy runs
        self._config: ProxyConfig | None = None
        self._stack: Stack | None = None
        self._starting: asyncio.Future[None] | None = None
        self._failed: str | None = None  # why the stack could not be built: every call is refused
        # the last long request of each recent episode: the next one parses only its new messages
        self.resent = ResentBodies()

    # -- mitmproxy lifecycle --------------------------------------------------------------------

    def load(self, loader: Any) -> None:
        loader.add_option("polarproxy_model", str, "", "Model folder with the tokenizer and chat template.")
        loader.add_option(
            "polarproxy_backend",
            str,
            "",
            "Backend URL (SGLang, vLLM or `polarproxy backend`). Default: the reverse target.",
        )
        loader.add_option(
            "polarproxy_backend_kind",
            str,
            "",
            "What serves the backend URL: sglang, vllm or local. Default: detected from what it answers.",
        )
        loader.add_option(
            "polarproxy_backend_mode",
            str,
            "tokens",
            "tokens: polarproxy renders the prompt and sends token IDs (T2 holds); chat: the server renders "
            "it from /v1/chat/completions.",
        )
        loader.add_option(
            "polarproxy_backend_logprobs",
            str,
            "",
            "What the backend's logprobs are: scaled (log_softmax(logits / T)) or raw. Default: the backend "
            "kind's (SGLang and local: scaled; vLLM: raw).",
        )
        loader.add_option(
            "polarproxy_db",
            str,
            "",
            "Store: a SQLite path or database URL. Default: $POLARPROXY_DB or the data dir.",
        )
        loader.add_option(
            "polarproxy_episode",
            str,
            "",
            "Episode for calls that name none. Default: a new episode per start.",
        )
        loader.add_option("polarproxy_max_tokens", int, 4096, "max_new_tokens when a request sets no limit.")
        loader.add_option(
            "polarproxy_prefix_policy",
            str,
            "extend",
            "extend: a call that continues an earlier one is prompted with that call's tokens + the new "
            "messages (T2); fresh: every call is rendered with the chat template as it stands.",
        )
        loader.add_option(
            "polarproxy_tool_format",
            str,
            "",
            "How the model writes tool calls: hermes, qwen-xml, llama-json, deepseek, mistral or harmony. "
            "Default: detected from the chat template and tokenizer.",
        )
        loader.add_option(
            "polarproxy_reasoning_format",
            str,
            "",
            "How the model writes reasoning: think (<think>...</think>) or none. "
            "Default: detected from the chat template and tokenizer.",
        )

    def configure(self, updated: set[str]) -> None:
        if self._injected or not any(k.startswith("polarproxy_") for k in updated):
            return
        opts = ctx.options
        if not opts.polarproxy_model:
            raise exceptions.OptionsError(
                "polarproxy_model is not set. Pass --set polarproxy_model=DIR (a model folder with a tokenizer)."
            )
        backend_url = opts.polarproxy_backend or _reverse_target(opts.mode)
        if not backend_url:
            raise exceptions.OptionsError(
                "polarproxy_backend is not set and the mode is not reverse:URL. "
                "Pass --set polarproxy_backend=http://HOST:PORT or --mode reverse:http://HOST:PORT."
            )
        from polarproxy.backends.selection import KINDS, MODES, SelectionError, check_choice
        from polarproxy.capture.stack import ProxyConfig
        from polarproxy.choices import BACKEND_LOGPROBS
        from polarproxy.errors import PolarproxyError
        from polarproxy.render.family import check_reasoning_format, check_tool_format
        from polarproxy.render.prefix import check_policy
        from polarproxy.render.renderer import Renderer

        try:
            policy = check_policy(opts.polarproxy_prefix_policy)
            tool, reasoning = opts.polarproxy_tool_format, opts.polarproxy_reasoning_format
            tool_format = check_tool_format(tool) if tool else None
            reasoning_format = check_reasoning_format(reasoning) if reasoning else None
            kind = check_choice(opts.polarproxy_backend_kind or None, KINDS, "backend kind")
            mode = check_choice(opts.polarproxy_backend_mode, MODES, "backend mode")
            logprobs = check_choice(
                opts.polarproxy_backend_logprobs or None, BACKEND_LOGPROBS, "backend logprobs"
            )
            model = Renderer(opts.polarproxy_model, defer=True).model_dir  # the folder checked, not loaded
        except PolarproxyError as e:
            raise exceptions.OptionsError(f"{e.message} {e.hint or ''}".strip()) from e
        except SelectionError as e:
            raise exceptions.OptionsError(str(e)) from e
        self._config = ProxyConfig(
            backend=backend_url,
            model=Path(model),
            db=opts.polarproxy_db or None,
            max_tokens_default=opts.polarproxy_max_tokens,
            backend_kind=kind,
            backend_mode=mode or "tokens",
            backend_logprobs=logprobs,
            prefix_policy=policy,
            tool_format=tool_format,
            reasoning_format=reasoning_format,
        )
        self.default_episode = opts.polarproxy_episode or None
        self.model_name = Path(model).name
        if "connection_strategy" in opts and opts.connection_strategy != "lazy":
            opts.update(connection_strategy="lazy")  # never dial the reverse target on connect

    async def running(self) -> None:
        if self._config is not None and not self._injected:  # mitmdump: the same assembly as `record`
            self._starting = asyncio.get_running_loop().create_future()
            try:
                await self._start_stack(self._config)
            finally:
                self._starting.set_result(None)
        if self.gateway is None:
            return
        self.responder = Responder(self.gateway.serve)
        proxyserver = ctx.master.addons.get("proxyserver")
        await self.responder.start(connections=getattr(proxyserver, "connections", None))
        if self.default_episode is None and not self._injected and self.writer is not None:  # mitmdump
            self.default_episode = await self.writer.create_episode(EpisodeStart(command=["mitmdump"]))

    async def _start_stack(self, cfg: ProxyConfig) -> None:
        """Build the stack (capture/stack.py: store, backend detection, gateway); on failure log the reason
        (mitmdump then exits 1) and refuse every call."""
        from polarproxy.capture.stack import open_stack
        from polarproxy.errors import PolarproxyError

        try:
            stack = await open_stack(cfg, defer_tokenizer=False)
        except PolarproxyError as e:
            self._failed = f"{e.message} {e.hint or ''}".strip()
        except Exception as e:  # the store raises its own error types
            self._failed = f"{type(e).__name__}: {e}"
        else:
            self._stack, self.gateway, self.writer = stack, stack.gateway, stack.writer
            return
        log.error("polarproxy cannot start: %s", self._failed)

    async def done(self) -> None:
        if self.responder is not None:
            await self.responder.stop()
        if self._stack is not None:
            from polarproxy.capture.stack import close_stack

            await close_stack(self._stack)

    # -- flows ----------------------------------------------------------------------------------

    async def request(self, flow: http.HTTPFlow) -> None:
        if self._starting is not None and not self._starting.done():
            await asyncio.shield(self._starting)  # mitmdump serves before its stack is built: wait for it
        if self._failed is not None:  # fail closed: nothing reaches the backend unrecorded
            dialect = route(flow.request.method, flow.request.path.partition("?")[0]) or OPENAI_CHAT
            message = f"polarproxy cannot serve: {self._failed}"
            flow.response = http.Response.make(503, dialect.error(503, message, "unavailable"), JSON_HEADERS)
            return
        if self.gateway is None or self.responder is None or self.writer is None or flow.response is not None:
            return  # (a response already: refused at its headers)
        try:
            await self._serve(flow)
        except Exception as e:  # fail closed: a request this hook did not finish never reaches the backend
            log.exception("internal error while routing %s %s", flow.request.method, flow.request.path)
            if flow.response is None and META_KEY not in flow.metadata:
                dialect = route(flow.request.method, flow.request.path.partition("?")[0]) or OPENAI_CHAT
                message = (
                    f"polarproxy could not route this request ({type(e).__name__}); nothing was forwarded."
                )
                flow.response = http.Response.make(
                    503, dialect.error(503, message, "internal_error"), JSON_HEADERS
                )

    async def _serve(self, flow: http.HTTPFlow) -> None:
        """Route one request: polarproxy's own routes, a provider route (parsed, recorded, served), or a
        provider-shaped 404."""
        assert self.gateway is not None and self.responder is not None and self.writer is not None
        req = flow.request
        path = req.path
        if path.startswith(CONTROL_PREFIX) or (
            self.control is not None and path.partition("?")[0] == "/health"
        ):
            await self._answer_control(flow)
            return
        episode = req.headers.get(EPISODE_HEADER) or None
        m = _EPISODE_PATH.match(path)
        if m:
            episode, path = m.group(1), m.group(2)
        bare_path = path.partition("?")[0]
        dialect = route(req.method, bare_path)
        if dialect is None:
            self._answer_other(flow, req.method, bare_path)
            return
        invalid = None if m is not None or episode is None else invalid_episode_header(episode)
        if invalid is not None and self.control is None:  # (serve refuses it below, counting the refusal)
            flow.response = http.Response.make(
                400, dialect.error(400, invalid, "invalid_episode"), JSON_HEADERS
            )
            return
        if self.control is not None:  # serve: API keys, and refusals that write nothing
            decided = await self.control.episode_for(req, episode, from_path=m is not None)
            if not isinstance(decided, str) and decided is not None:
                flow.response = http.Response.make(
                    decided.status, dialect.error(decided.status, decided.message, decided.code), JSON_HEADERS
                )
                return
            episode = decided
        episode = episode or self.default_episode
        if episode is None:  # a proxy without a default episode (a control token normally refuses first)
            message = (
                "This proxy has no default episode: name one with the x-polarproxy-episode header or an "
                "/e/ID/ path, or send an episode's API key."
            )
            flow.response = http.Response.make(400, dialect.error(400, message, "no_episode"), JSON_HEADERS)
            return
        if not self.writer.knows_episode(episode):  # its first call here creates it (per call: a set lookup)
            named = episode != self.default_episode or self.default_start is None
            await self.writer.ensure_episode(
                episode, EpisodeStart(command=["serve"]) if named else self.default_start
            )
        limit = self.gateway.options.max_body_bytes
        try:
            body: bytes | None = read_body(req.raw_content or b"", req.headers.get("content-encoding"), limit)
            refused = None
        except BodyError as e:  # refused before anything is parsed; recorded with what fits of the body
            body, refused = None, e
        start = CallStart(
            episode_id=episode,
            dialect=dialect.name,
            method=req.method,
            path=redact_path(path),
            model="",
            stream=False,
            request_headers=redact_headers(req.headers.items(multi=True)),
            request_body=(body or b"").decode("utf-8", errors="replace"),
            conversation=None,
            prompt_ids=[],
            started_at=time.time(),
        )
        try:
            if refused is not None:
                raise refused
            conv = self.resent.parse(dialect, episode, body or b"", path=bare_path, query=dict(req.query))
            for tool in conv.tools:
                check_depth(tool.parameters, what=f"Tool {tool.name!r}'s parameters")
        except (DialectError, BodyError) as e:
            await self.gateway.record_failure(
                start, status="failed", error=f"bad request: {e.message}", http_status=e.status
            )
            flow.response = http.Response.make(
                e.status, dialect.error(e.status, e.message, e.code), JSON_HEADERS
            )
            return
        except Exception as e:  # a dialect bug: answer in the format's own shape, not mitmproxy's HTML 502
            log.exception("internal error while parsing a %s request", dialect.name)
            await self.gateway.record_failure(
                start, status="failed", error=f"internal error: {type(e).__name__}: {e}", http_status=500
            )
            message = "polarproxy could not read this request (an internal error, recorded with the call)."
            flow.response = http.Response.make(
                500, dialect.error(500, message, "internal_error"), JSON_HEADERS
            )
            return
        start.model = conv.model
        start.stream = conv.stream
        start.conversation = conv  # made plain data by the store writer, off the event loop
        sampling = await self.control.sampling_for(episode) if self.control is not None else None
        call = PendingCall(
            flow_id=flow.id,
            episode_id=episode,
            dialect=dialect,
            conversation=conv,
            start=start,
            sampling=sampling,
        )
        del conv, start  # held by `call` alone from here (see below)
        if not call.conversation.stream:  # a whole answer: made here, no hop through the responder
            client = flow.client_conn
            sink = await self.responder.serve_inline(
                call, lambda: not (client.state & ConnectionState.CAN_READ)
            )
            # Measured: mitmproxy's type checks raise and catch TypeErrors while it builds a Response, and
            # their tracebacks keep this frame alive until the cyclic collector runs. Holding the call's
            # prompt and conversation here then made every collection walk them (5x the gc time at 32k).
            del call
            if sink is None:
                flow.kill()
            else:
                flow.response = http.Response.make(sink.status, bytes(sink.body), sink.headers)
            return
        parked = self.responder.serve_stream(call)
        flow.metadata[META_KEY] = flow.id
        req.scheme = "http"
        req.host = "127.0.0.1"
        req.port = self.responder.port
        req.method = "POST"
        req.path = parked
        req.headers.clear()
        req.headers["host"] = f"127.0.0.1:{self.responder.port}"
        req.content = b""

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        """A body announced past the bound is refused before mitmproxy reads it."""
        if self.gateway is None or flow.request.path.startswith(CONTROL_PREFIX):
            return
        limit = self.gateway.options.max_body_bytes
        length = flow.request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            dialect = route(flow.request.method, flow.request.path.partition("?")[0]) or OPENAI_CHAT
            e = too_large(int(length), limit)
            flow.response = http.Response.make(
                e.status, dialect.error(e.status, e.message, e.code), JSON_HEADERS
            )

    async def responseheaders(self, flow: http.HTTPFlow) -> None:
        if META_KEY not in flow.metadata or flow.response is None:
            return
        if self.responder is not None and self.responder.held:  # a stream's head given ahead: wait for it
            client = flow.client_conn
            response = await self.responder.hold_head(
                flow.request.path, flow.response, lambda: not (client.state & ConnectionState.CAN_READ)
            )
            if response is None:  # the harness hung up
                flow.kill()
                return
            if response is inprocess.NO_HEAD:  # the answer ended without a head: mitmproxy answers the
                flow.response.stream = False  # failure that follows (a 502 with its message), as before
                return
            flow.response = response
        flow.response.stream = True  # pass the answer through as the gateway writes it

    def error(self, flow: http.HTTPFlow) -> None:
        if META_KEY in flow.metadata and self.responder is not None:
            self.responder.abort(flow.metadata[META_KEY])

    async def _answer_control(self, flow: http.HTTPFlow) -> None:
        """polarproxy's own routes: `POST /polarproxy/v1/episodes/{id}/reward` with {"reward": x} or
        {"reward": x, "call": N} (N: the call's sequence number, as `polarproxy show` prints it)."""
        assert self.writer is not None
        if self.control is not None and await self.control.answer(flow):
            return
        from polarproxy.store.errors import NotFoundError
        from polarproxy.store.records import RewardOrigin

        req = flow.request
        bare = req.path.partition("?")[0]
        m = _REWARD_PATH.match(bare)
        if m is None:
            _json(
                flow,
                404,
                {"error": f"Unknown route {req.method} {bare}. polarproxy serves: POST {REWARD_ROUTE}."},
            )
            return
        if req.method != "POST":
            _json(flow, 405, {"error": f'{bare} takes POST, not {req.method}. Send {{"reward": 1.0}}.'})
            return
        episode_id = m.group(1)
        try:
            reward, call = _reward_body(req.content or b"")
        except ValueError as e:
            _json(flow, 400, {"error": f'{e} Send {{"reward": 1.0}} or {{"reward": 1.0, "call": 0}}.'})
            return
        try:
            stored = await self.writer.set_rewards(
                episode_id,
                episode=reward,
                set_episode=call is None,
                calls={} if call is None else {call: reward},
                origin=RewardOrigin(source="http"),
            )
        except NotFoundError as e:
            _json(flow, 404, {"error": str(e)})
            return
        except ValueError as e:
            _json(flow, 400, {"error": str(e)})
            return
        except Exception as e:  # the store and its spool both failed
            _json(flow, 503, {"error": f"The reward was not stored: {e}"})
            return
        answer = {"episode_id": episode_id, "call": call, "reward": reward, "source": "http"}
        if stored is None:  # the database is down: the reward waits in the spool
            _json(flow, 202, {**answer, "spooled": True})
        else:
            _json(flow, 200, answer)

    def _answer_other(self, flow: http.HTTPFlow, method: str, path: str) -> None:
        model = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "polarproxy"}
        bare = path.rstrip("/")
        if method == "GET" and bare.endswith("/models"):
            body = {"object": "list", "data": [model]}
            flow.response = http.Response.make(200, orjson.dumps(body), JSON_HEADERS)
            return
        if (
            method == "GET" and "/models/" in bare
        ):  # any name: the proxy serves whatever model the backend has
            model["id"] = bare.rsplit("/models/", 1)[1]
            flow.response = http.Response.make(200, orjson.dumps(model), JSON_HEADERS)
            return
        msg = (
            f"Unknown route {method} {path}. polarproxy serves: {', '.join(served_routes())}, GET /v1/models."
        )
        flow.response = http.Response.make(404, OPENAI_CHAT.error(404, msg, "unknown_route"), JSON_HEADERS)


def _json(flow: http.HTTPFlow, status: int, body: dict[str, Any]) -> None:
    flow.response = http.Response.make(status, orjson.dumps(body), JSON_HEADERS)


def _reward_body(content: bytes) -> tuple[float, int | None]:
    """(reward, call number or None) from a reward request body; ValueError saying what is wrong."""
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"The body is not valid JSON: {e}.") from None
    if not isinstance(body, dict):
        raise ValueError(f"The body must be a JSON object, not {type(body).__name__}.")
    unknown = sorted(set(body) - {"reward", "call"})
    if unknown:
        raise ValueError(f"Unknown keys {unknown}; allowed: 'reward', 'call'.")
    reward = body.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise ValueError(f"'reward' must be a finite number, got {reward!r}.")
    call = body.get("call")
    if call is not None and (isinstance(call, bool) or not isinstance(call, int) or call < 0):
        raise ValueError(f"'call' must be a call number (0 is the first call), got {call!r}.")
    return float(reward), call


def _reverse_target(modes: Any) -> str:
    for mode in modes or []:
        if isinstance(mode, str) and mode.startswith("reverse:"):
            return mode.removeprefix("reverse:")
    return ""
