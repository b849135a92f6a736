"""`polarproxy record` and `polarproxy serve`: a proxy in this process, a harness as a child process.

One `record` is one episode. The child gets base URLs and placeholder keys for every provider SDK, so an
unmodified harness talks to the proxy; its stdin/stdout/stderr are the terminal's; SIGTERM, SIGHUP and
SIGQUIT are passed on (SIGINT from a terminal reaches the child directly, as it shares the terminal),
and `record` exits with the child's exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from polarproxy.backends.base import Backend, BackendError
from polarproxy.backends.selection import SelectionError, make_backend, open_backend
from polarproxy.capture.gateway import Gateway, GatewayOptions
from polarproxy.capture.presets import Preset
from polarproxy.capture.proxy import RunningProxy, start_proxy
from polarproxy.capture.store_writer import StoreWriter
from polarproxy.errors import UsageError
from polarproxy.render.renderer import Renderer
from polarproxy.store.records import EpisodeStart
from polarproxy.store.store import Store
from polarproxy.store.urls import display_url

PLACEHOLDER_KEY = "sk-polarproxy-local"
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


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
    # harness preset (`record --harness NAME`); its name is the episode's harness
    preset: Preset | None = None
    api: str | None = None  # the preset's wire format, for presets that speak several (`--api`)
    model_name: str | None = None  # the model the harness is told to use (default: the model folder's name)


@dataclass
class RecordOutcome:
    exit_code: int
    episode_id: str
    db: str


@dataclass
class Stack:
    """What a running proxy is made of: the store and its writer thread, the renderer, the gateway."""

    store: Store
    writer: StoreWriter
    gateway: Gateway
    renderer: Renderer


async def open_stack(cfg: ProxyConfig) -> Stack:
    renderer = Renderer(cfg.model)
    try:
        store = Store.open(cfg.db)
    except Exception as e:
        raise UsageError(
            f"Cannot open the store '{display_url(cfg.db) if cfg.db else 'default'}': {e}",
            hint="Pass --db PATH to a writable file, or set POLARPROXY_DB.",
        ) from e
    backend = await _open_backend(cfg)
    writer = StoreWriter(store)
    gateway = Gateway(
        renderer=renderer,
        backend=backend,
        store=writer,
        options=GatewayOptions(max_tokens_default=cfg.max_tokens_default, keepalive_s=cfg.keepalive_s),
    )
    return Stack(store=store, writer=writer, gateway=gateway, renderer=renderer)


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


async def _start_episode(stack: Stack, cfg: ProxyConfig, command: list[str]) -> tuple[str, RunningProxy]:
    """Create the episode that calls without one go to, and start mitmproxy with the recorder."""
    episode_id = await stack.writer.create_episode(
        EpisodeStart(
            command=command,
            harness=cfg.harness,
            cwd=os.getcwd(),
            task=cfg.task,
            group_id=cfg.group_id,
            metadata=dict(cfg.metadata),
        )
    )
    try:
        proxy = await start_proxy(
            stack.gateway,
            writer=stack.writer,
            default_episode=episode_id,
            model_name=stack.renderer.model_dir.name,
            host=cfg.host,
            port=cfg.port,
        )
    except BaseException:
        await stack.writer.finish_episode(episode_id, status="failed", exit_code=None)
        await close_stack(stack)
        raise
    return episode_id, proxy


async def record(
    cfg: ProxyConfig, command: list[str], *, on_ready: Callable[[str, str], None] | None = None
) -> RecordOutcome:
    """Run `command` as one recorded episode. Returns the child's exit code (128+N for signal N)."""
    stack = await open_stack(cfg)
    episode_id, proxy = await _start_episode(stack, cfg, command)
    if on_ready:
        on_ready(proxy.url, episode_id)
    loop = asyncio.get_running_loop()
    rc = 127
    home: Path | None = None
    try:
        env = harness_env(os.environ, proxy.url, episode_id)
        if cfg.preset is not None:
            home = Path(tempfile.mkdtemp(prefix=f"polarproxy-{cfg.preset.name}-"))
            env = prepare_preset(cfg, env, proxy.url, home)
        try:
            proc = await asyncio.create_subprocess_exec(*command, env=env)
        except (FileNotFoundError, PermissionError) as e:
            print(f"Error: cannot run {command[0]!r}: {e.strerror}.", file=sys.stderr)
            rc = 127 if isinstance(e, FileNotFoundError) else 126
        else:
            for sig in FORWARDED_SIGNALS:
                loop.add_signal_handler(sig, _forward, proc, sig)
            with contextlib.suppress(ValueError):
                loop.add_signal_handler(signal.SIGINT, lambda: None)  # the child got it from the terminal
            rc = await proc.wait()
            rc = 128 - rc if rc < 0 else rc
    finally:
        for sig in (*FORWARDED_SIGNALS, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)
        await proxy.stop()
        await stack.writer.finish_episode(episode_id, status="ok" if rc == 0 else "failed", exit_code=rc)
        await close_stack(stack)
    return RecordOutcome(exit_code=rc, episode_id=episode_id, db=str(stack.store.url))


def _forward(proc: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(sig)


async def serve(
    cfg: ProxyConfig, *, on_ready: Callable[[str, str], None] | None = None, stop: asyncio.Event | None = None
) -> str:
    """Serve until SIGINT/SIGTERM (or `stop`). Calls without an episode go to one new episode."""
    stack = await open_stack(cfg)
    episode_id, proxy = await _start_episode(stack, cfg, ["serve"])
    if on_ready:
        on_ready(proxy.url, episode_id)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        await proxy.stop()
        await stack.writer.finish_episode(episode_id, status="ok", exit_code=None)
        await close_stack(stack)
    return episode_id
