"""`polarproxy record`: a proxy in this process, a harness as a child process.

One `record` is one episode. The child gets base URLs and placeholder keys for every provider SDK
(harness/env.py), so an unmodified harness talks to the proxy; its stdin/stdout/stderr are the terminal's.
The child runs in its own process group, signals to `record` are passed on to it, it dies with `record`,
and `record` exits with its exit code (harness/child.py, shared with intercept mode). `record` starts the
child as soon as the store, the backend and the proxy's socket are ready; mitmproxy starts beside it
(capture/early.py).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from polarproxy.capture.early import EarlyProxy
from polarproxy.capture.stack import ProxyConfig, Stack, close_stack, create_episode, open_stack
from polarproxy.harness.child import ChildExit, run_child, stop_harness
from polarproxy.harness.env import PLACEHOLDER_KEY, base_urls, harness_env
from polarproxy.rewards.verifier import Verifier, VerifierResult, run_verifier

if TYPE_CHECKING:  # YAML is imported only with a preset, mitmproxy once the proxy starts (capture/early.py)
    from polarproxy.capture.proxy import RunningProxy
    from polarproxy.harness.presets import Preset


@dataclass
class HarnessRun:
    """What `record` adds to the proxy's configuration: the harness preset, its wire format and model name,
    and the verifier that rewards the episode."""

    # harness preset (`record --harness NAME`); its name is the episode's harness
    preset: Preset | None = None
    api: str | None = None  # the preset's wire format, for presets that speak several (`--api`)
    model_name: str | None = None  # the model the harness is told to use (default: the model folder's name)
    # `record --reward-cmd`: a verifier run after the harness, in its folder and environment (rewards/)
    verifier: Verifier | None = None


@dataclass
class RecordOutcome:
    exit_code: int
    episode_id: str
    db: str
    reward: VerifierResult | None = None  # what the verifier gave (None: no --reward-cmd)
    reward_error: str | None = None  # why no reward was stored (the verifier could not run, the store failed)


def prepare_preset(
    cfg: ProxyConfig, run: HarnessRun, env: dict[str, str], proxy_url: str, home: Path
) -> dict[str, str]:
    """Write the preset's config files under `home` and return the child's environment with its variables."""
    assert run.preset is not None
    rendered = run.preset.render(
        proxy_url=proxy_url,
        key=PLACEHOLDER_KEY,
        model=run.model_name or cfg.model.name,
        home=home,
        api=run.api,
    )
    rendered.write_files()
    return rendered.apply_env(env)


async def record(
    cfg: ProxyConfig,
    command: list[str],
    *,
    run: HarnessRun | None = None,
    on_ready: Callable[[str, str], None] | None = None,
) -> RecordOutcome:
    """Run `command` as one recorded episode. Returns the child's exit code (128+N for signal N).
    `on_ready(url, episode_id)` is called once the proxy's socket listens (before mitmproxy serves it:
    connections wait there), just before the harness starts."""
    run = run or HarnessRun()
    stack = await open_stack(cfg)
    episode_id = await create_episode(stack, cfg, command)
    try:  # mitmproxy starts beside the harness (capture/early.py)
        proxy = EarlyProxy(
            lambda sock: _serve_recorder(stack, episode_id, sock),
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
        env = harness_env(os.environ, base_urls(proxy.url), PLACEHOLDER_KEY, episode_id)
        if run.preset is not None:
            home = Path(tempfile.mkdtemp(prefix=f"polarproxy-{run.preset.name}-"))
            env = prepare_preset(cfg, run, env, proxy.url, home)
        # signals, process group, exit code: harness/child.py; the proxy starts meanwhile
        harness = asyncio.create_task(run_child(command, env))
        # a verifier runs while the proxy still serves (it may POST rewards to it): the proxy must start
        await proxy.until_needed(harness, always=run.verifier is not None)
        child = await harness
        if child.error:
            print(f"Error: {child.error}", file=sys.stderr)
        rc = child.code
        if run.verifier is not None:
            verified = await _verify(run.verifier, env, episode_id, rc)
    finally:
        await stop_harness(harness)  # still running: the proxy could not start
        if home is not None:
            shutil.rmtree(home, ignore_errors=True)
        await proxy.close()
        try:  # a full disk or a lost database must not turn the harness's exit code into a traceback
            await stack.writer.finish_episode(episode_id, status="ok" if rc == 0 else "failed", exit_code=rc)
        except Exception as e:
            print(
                f"Error: the end of episode {episode_id} was not stored: {e}. `polarproxy db repair` ends it "
                "once the store takes writes again.",
                file=sys.stderr,
            )
        if isinstance(verified, VerifierResult):
            verified_error = await _store_reward(stack, episode_id, verified)
        try:
            await close_stack(stack)
        except Exception as e:
            print(f"Error: the store did not close cleanly: {e}", file=sys.stderr)
    assert rc is not None  # set once the harness ended; anything else raised above
    return RecordOutcome(
        exit_code=rc,
        episode_id=episode_id,
        db=str(stack.store.url),
        reward=verified if isinstance(verified, VerifierResult) else None,
        reward_error=verified if isinstance(verified, str) else verified_error,
    )


async def _serve_recorder(stack: Stack, episode_id: str, sock: socket.socket) -> RunningProxy:
    """mitmproxy with the recorder on the socket `record` listens on (capture/proxy.py: imported here, beside
    the harness, not before it starts)."""
    from polarproxy.capture.proxy import serve_recorder

    return await serve_recorder(stack, episode_id, sock=sock)


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
    except Exception as e:  # StoreError, ValueError, or the spool's disk full as well
        return f"the verifier's reward was not stored: {e}"
    return None
