"""`polarproxy record` and `polarproxy serve`: a proxy in this process, a harness as a child process.

One `record` is one episode. The child gets base URLs and placeholder keys for every provider SDK, so an
unmodified harness talks to the proxy; its stdin/stdout/stderr are the terminal's. The child runs in its
own process group, signals to `record` are passed on to it, it dies with `record`, and `record` exits with
its exit code (capture/child.py, shared with intercept mode). `record` starts the child as soon as the
store, the backend and the proxy's socket are ready; mitmproxy starts beside it (capture/early.py).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from polarproxy.backends.base import Backend, BackendError
from polarproxy.backends.selection import SelectionError, make_backend, open_backend
from polarproxy.capture.child import ChildExit, run_child, stop_harness
from polarproxy.capture.early import EarlyProxy
from polarproxy.capture.gateway import Gateway, GatewayOptions
from polarproxy.capture.recording import create_recorded_episode, open_recording_store
from polarproxy.capture.store_writer import StoreWriter
from polarproxy.errors import UsageError
from polarproxy.render.prefix import CALLS_PER_EPISODE, Turn, turn_from_record
from polarproxy.render.renderer import Renderer
from polarproxy.rewards.verifier import Verifier, VerifierResult, run_verifier
from polarproxy.store.errors import NotFoundError, StoreError
from polarproxy.store.store import Store

if TYPE_CHECKING:  # mitmproxy is imported only when a proxy starts (capture/early.py), YAML with a preset
    from polarproxy.capture.presets import Preset
    from polarproxy.capture.proxy import RunningProxy

PLACEHOLDER_KEY = "sk-polarproxy-local"


def harness_env(base: Mapping[str, str], proxy_url: str, episode_id: str) -> dict[str, str]:
    """The child's environment: every provider SDK pointed at the proxy, with placeholder keys."""
    env = dict(base)
    env.update(
        {
            "OPENAI_BASE_URL": f"{proxy_url}/v1",
            "OPENAI_API_KEY": PLACEHOLDER_KEY,
            "ANTHROPIC_BASE_URL": proxy_url,
            "ANTHROPIC_API_KEY": PLACEHOLDER_KEY,
            "GOOGLE_GEMINI_BASE_URL": proxy_url,
            "GEMINI_API_KEY": PLACEHOLDER_KEY,
            "POLARPROXY_URL": proxy_url,
            "POLARPROXY_EPISODE": episode_id,
        }
    )
    env.pop("ANTHROPIC_AUTH_TOKEN", None)
    return env


def prepare_preset(cfg: ProxyConfig, env: dict[str, str], proxy_url: str, home: Path) -> dict[str, str]:
    """Write the preset's config files under `home` and return the child's environment with its variables."""
    assert cfg.preset is not None
    rendered = cfg.preset.render(
        proxy_url=proxy_url,
        key=PLACEHOLDER_KEY,
        model=cfg.model_name or cfg.model.name,
        home=home,
        api=cfg.api,
    )
    rendered.write_files()
    return rendered.apply_env(env)


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
    # harness preset (`record --harness NAME`); its name is the episode's harness
    preset: Preset | None = None
    api: str | None = None  # the preset's wire format, for presets that speak several (`--api`)
    model_name: str | None = None  # the model the harness is told to use (default: the model folder's name)
    # `record --reward-cmd`: a verifier run after the harness, in its folder and environment (rewards/)
    verifier: Verifier | None = None
    # `serve --control-token` / POLARPROXY_CONTROL_TOKEN: the control API and harness calls need it / a key
    control_token: str | None = None


@dataclass
class RecordOutcome:
    exit_code: int
    episode_id: str
    db: str
    reward: VerifierResult | None = None  # what the verifier gave (None: no --reward-cmd)
    reward_error: str | None = None  # why no reward was stored (the verifier could not run, the store failed)


@dataclass
class Stack:
    """What a running proxy is made of: the store and its writer thread, the renderer, the gateway."""

    store: Store
    writer: StoreWriter
    gateway: Gateway
    renderer: Renderer


async def open_stack(cfg: ProxyConfig) -> Stack:
    """The store, its writer, the backend client and the gateway. The tokenizer is checked but not loaded
    (`Renderer(defer=True)`): `renderer.load_in_background()` starts that once the proxy listens, so that
    it runs while the harness starts up, and the first call waits for it."""
    renderer = Renderer(cfg.model, defer=True)
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


async def _create_episode(stack: Stack, cfg: ProxyConfig, command: list[str]) -> str:
    """The episode that calls without one go to."""
    return await create_recorded_episode(
        stack.writer,
        command,
        harness=cfg.harness,
        task=cfg.task,
        group_id=cfg.group_id,
        metadata=dict(cfg.metadata),
    )


async def _serve_recorder(
    stack: Stack,
    episode_id: str,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    sock: socket.socket | None = None,
) -> RunningProxy:
    """mitmproxy with the recorder (on host:port, or serving `sock`); once it serves, the tokenizer starts
    loading in the background (the first call waits for it)."""
    from polarproxy.capture.proxy import start_proxy

    proxy = await start_proxy(
        stack.gateway,
        writer=stack.writer,
        default_episode=episode_id,
        model_name=stack.renderer.model_dir.name,
        host=host,
        port=port,
        sock=sock,
    )
    stack.renderer.load_in_background()
    return proxy


async def _start_episode(stack: Stack, cfg: ProxyConfig, command: list[str]) -> tuple[str, RunningProxy]:
    """Create the episode that calls without one go to, and start mitmproxy with the recorder (`serve`)."""
    episode_id = await _create_episode(stack, cfg, command)
    try:
        proxy = await _serve_recorder(stack, episode_id, host=cfg.host, port=cfg.port)
    except BaseException:
        await stack.writer.finish_episode(episode_id, status="failed", exit_code=None)
        await close_stack(stack)
        raise
    return episode_id, proxy


async def record(
    cfg: ProxyConfig, command: list[str], *, on_ready: Callable[[str, str], None] | None = None
) -> RecordOutcome:
    """Run `command` as one recorded episode. Returns the child's exit code (128+N for signal N).
    `on_ready(url, episode_id)` is called once the proxy's socket listens (before mitmproxy serves it:
    connections wait there), just before the harness starts."""
    stack = await open_stack(cfg)
    episode_id = await _create_episode(stack, cfg, command)
    try:  # mitmproxy starts beside the harness (capture/early.py)
        proxy = EarlyProxy(
            lambda sock: _serve_recorder(stack, episode_id, sock=sock),
            module="polarproxy.capture.proxy",
            host=cfg.host,
            port=cfg.port,
        )
    except BaseException:
        await stack.writer.finish_episode(episode_id, status="failed", exit_code=None)
        await close_stack(stack)
        raise
    if on_ready:
        on_ready(proxy.url, episode_id)
    rc: int | None = None  # None: the harness did not run to its end (the proxy could not start)
    home: Path | None = None
    harness: asyncio.Task[ChildExit] | None = None
    verified: VerifierResult | str | None = None
    verified_error: str | None = None
    try:
        env = harness_env(os.environ, proxy.url, episode_id)
        if cfg.preset is not None:
            home = Path(tempfile.mkdtemp(prefix=f"polarproxy-{cfg.preset.name}-"))
            env = prepare_preset(cfg, env, proxy.url, home)
        # signals, process group, exit code: capture/child.py; the proxy starts meanwhile
        harness = asyncio.create_task(run_child(command, env))
        # a verifier runs while the proxy still serves (it may POST rewards to it): the proxy must start
        await proxy.until_needed(harness, always=cfg.verifier is not None)
        child = await harness
        if child.error:
            print(f"Error: {child.error}", file=sys.stderr)
        rc = child.code
        if cfg.verifier is not None:
            verified = await _verify(cfg.verifier, env, episode_id, rc)
    finally:
        await stop_harness(harness)  # still running: the proxy could not start
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)
        await proxy.close()
        await stack.writer.finish_episode(episode_id, status="ok" if rc == 0 else "failed", exit_code=rc)
        if isinstance(verified, VerifierResult):
            verified_error = await _store_reward(stack, episode_id, verified)
        await close_stack(stack)
    assert rc is not None  # set once the harness ended; anything else raised above
    return RecordOutcome(
        exit_code=rc,
        episode_id=episode_id,
        db=str(stack.store.url),
        reward=verified if isinstance(verified, VerifierResult) else None,
        reward_error=verified if isinstance(verified, str) else verified_error,
    )


async def _verify(verifier: Verifier, env: dict[str, str], episode_id: str, rc: int) -> VerifierResult | str:
    """Run the verifier off the event loop (the proxy keeps serving); a str says why it could not run."""
    try:
        return await asyncio.to_thread(
            run_verifier, verifier, cwd=os.getcwd(), env=env, episode_id=episode_id, harness_exit_code=rc
        )
    except OSError as e:
        return f"cannot run the reward command: {e.strerror or e}"


async def _store_reward(stack: Stack, episode_id: str, result: VerifierResult) -> str | None:
    """Record the verifier's reward with where it came from; a str says why it was not stored."""
    try:
        await stack.writer.set_rewards(
            episode_id,
            episode=result.reward,
            set_episode=result.set_episode,
            calls=result.calls,
            origin=result.origin(),
        )
    except (StoreError, ValueError) as e:
        return f"the verifier's reward was not stored: {e}"
    return None


async def serve(
    cfg: ProxyConfig, *, on_ready: Callable[[str, str], None] | None = None, stop: asyncio.Event | None = None
) -> str:
    """Serve until SIGINT/SIGTERM (or `stop`). Calls without an episode go to one new episode; episodes
    created through the control API (capture/control.py) are named by their API keys."""
    from polarproxy.capture.control import Control
    from polarproxy.store import keys

    stack = await open_stack(cfg)
    episode_id, proxy = await _start_episode(stack, cfg, ["serve"])
    proxy.recorder.control = Control(
        stack.writer, token=cfg.control_token, default_episode=episode_id, url=proxy.url
    )
    if on_ready:
        on_ready(proxy.url, episode_id)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM) if threading.current_thread() is threading.main_thread() else ()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        await proxy.stop()
        try:  # episodes of the control API outlive this proxy: another one on the database serves them on
            await asyncio.to_thread(keys.detach, stack.store, stack.writer.identity.id)
        except StoreError as e:
            print(f"polarproxy: could not hand the running episodes on: {e}", file=sys.stderr)
        await stack.writer.finish_episode(episode_id, status="ok", exit_code=None)
        await close_stack(stack)
    return episode_id
