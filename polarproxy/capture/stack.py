"""The one assembly of the proxy path: store and writer thread, backend client (its kind detected), renderer
and gateway (mitmproxy with the recorder goes in front of them: capture/proxy.py). mitmdump's addon, `record`, `serve`,
`rollout`'s in-process gateway and each Ray node build their proxy here, so each gets the same backend
detection, vLLM and chat mode, and prefix index backed by the store."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from polarproxy.backends.base import Backend, BackendError
from polarproxy.backends.selection import SelectionError, make_backend, open_backend
from polarproxy.capture.bodies import MAX_BODY_BYTES
from polarproxy.capture.gateway import Gateway, GatewayOptions
from polarproxy.capture.recording import open_recording_store, recorded_episode_start
from polarproxy.errors import UsageError
from polarproxy.render.prefix import CALLS_PER_EPISODE, Turn, turn_from_record
from polarproxy.render.renderer import Renderer
from polarproxy.store.errors import NotFoundError
from polarproxy.store.records import EpisodeStart
from polarproxy.store.store import Store
from polarproxy.store.writer import StoreWriter


@dataclass
class ProxyConfig:
    backend: str
    model: Path
    db: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    max_tokens_default: int = 4096
    keepalive_s: float = 15.0
    harness: str | None = None
    task: str | None = None
    group_id: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    check_backend: bool = True  # fail at start when the backend's /health does not answer
    backend_kind: str | None = None  # sglang | vllm | local; None: detected from what the server answers
    backend_mode: str = "tokens"  # tokens (polarproxy renders) | chat (the server renders; T2 does not hold)
    prefix_policy: str = "extend"  # extend (T2) | fresh (every call rendered as the chat template does)
    # `--tool-format` / `--reasoning-format`; None: detected from the chat template (render/family.py)
    tool_format: str | None = None  # hermes | qwen-xml | llama-json | deepseek | mistral | harmony
    reasoning_format: str | None = None  # think | none
    # `serve --control-token` / POLARPROXY_CONTROL_TOKEN: the control API and harness calls need it / a key
    control_token: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES  # `--max-body-bytes`: a request body's bound, after decompression
    # `--temperature --top-p --top-k --sampling-policy` (capture/sampling.py `sent_sampling`)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    sampling_policy: str = "harness"
    # `--backend-logprobs scaled|raw`; None: the backend kind's default (logprob_semantics.py)
    backend_logprobs: str | None = None


@dataclass
class Stack:
    """What a running proxy is made of: the store and its writer thread, the renderer, the gateway."""

    store: Store
    writer: StoreWriter
    gateway: Gateway
    renderer: Renderer


async def open_stack(cfg: ProxyConfig, *, defer_tokenizer: bool = True) -> Stack:
    """The store, its writer, the backend client and the gateway. With `defer_tokenizer` the tokenizer is
    checked but not loaded (`Renderer(defer=True)`): `renderer.load_in_background()` starts that once the
    proxy listens, so that it runs while the harness starts up, and the first call waits for it."""
    renderer = Renderer(cfg.model, defer=defer_tokenizer)
    store = open_recording_store(cfg.db)  # refused before the harness runs when it takes no writes
    backend = await _open_backend(cfg)
    writer = StoreWriter(store)
    gateway = Gateway(
        renderer=renderer,
        backend=backend,
        store=writer,
        options=GatewayOptions(
            max_tokens_default=cfg.max_tokens_default,
            keepalive_s=cfg.keepalive_s,
            prefix_policy=cfg.prefix_policy,
            tool_format=cfg.tool_format,
            reasoning_format=cfg.reasoning_format,
            max_body_bytes=cfg.max_body_bytes,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            sampling_policy=cfg.sampling_policy,
            backend_logprobs=cfg.backend_logprobs,
        ),
    )
    gateway.prefixes.loader = store_turns(store, renderer)  # T2 across proxies: the store backs the index
    return Stack(store=store, writer=writer, gateway=gateway, renderer=renderer)


def store_turns(store: Store, renderer: Renderer) -> Callable[[str], list[Turn]]:
    """The prefix index's loader: an episode's recent finished calls, from the store, as Turns (T2 holds for
    a proxy that did not serve them: a restart, another node)."""

    def load(episode_id: str) -> list[Turn]:
        try:
            calls = list(store.iter_calls([episode_id], status="ok"))
        except NotFoundError:
            return []
        turns = []
        for c in calls[-CALLS_PER_EPISODE:]:
            if c.render_mode == "server":
                continue  # server-rendered prompts are not extended (chat mode)
            turn = turn_from_record(
                renderer,
                call_id=c.id,
                conversation=c.conversation,
                completion=c.completion,
                prompt_ids=c.prompt_ids,
                output_ids=c.output_ids,
                finish_reason=c.finish_reason,
                render_note=c.render_note,
            )
            if turn is not None:
                turns.append(turn)
        return turns

    return load


async def _open_backend(cfg: ProxyConfig) -> Backend:
    """The backend client, its kind detected when not given, its health checked (`check_backend`)."""
    try:
        if not cfg.check_backend:
            return make_backend(cfg.backend, cfg.backend_kind or "sglang", cfg.backend_mode)
        return await open_backend(cfg.backend, cfg.backend_kind, cfg.backend_mode)
    except SelectionError as e:
        raise UsageError(
            str(e),
            hint="Pass --backend-kind sglang|vllm|local (or set POLARPROXY_BACKEND_KIND) and --backend-mode "
            "tokens|chat (POLARPROXY_BACKEND_MODE).",
        ) from e
    except BackendError as e:
        raise UsageError(
            f"{e.message} (checked at start; nothing was run).",
            hint=f"Is the server at {cfg.backend} running and ready? Start one with `polarproxy backend --model DIR "
            "--port 30000`, SGLang, or vLLM (`python -m vllm.entrypoints.openai.api_server --model DIR`), then "
            "pass --backend URL.",
        ) from e


async def close_stack(stack: Stack) -> None:
    await stack.gateway.backend.aclose()
    stack.writer.close()


async def create_episode(stack: Stack, cfg: ProxyConfig, command: list[str]) -> str:
    """The episode that calls without one go to."""
    return await stack.writer.create_episode(episode_start(cfg, command))


def episode_start(cfg: ProxyConfig, command: list[str]) -> EpisodeStart:
    """What the episode that calls without one go to starts with."""
    return recorded_episode_start(command, cfg.harness, cfg.task, cfg.group_id, dict(cfg.metadata))
