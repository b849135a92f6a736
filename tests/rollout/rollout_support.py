"""Helpers of the rollout tests: where the example is, a fixed-reply backend double
(polarproxy.backends.stub) on loopback, and `polarproxy rollout` as a real subprocess."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "rollout"
AGENT = EXAMPLE / "agent.py"
IN_CI = bool(os.environ.get("CI"))


class Stub:
    def __init__(self, cfg) -> None:
        from polarproxy.backends.stub import StubBackend

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.stub = StubBackend(cfg)
        port = asyncio.run_coroutine_threadsafe(self.stub.start(), self.loop).result(10)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.stub.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def rollout_argv(*args: str) -> list[str]:
    """`polarproxy rollout ARGS` as a subprocess (through the app once cli.py registers the command)."""
    from polarproxy import cli

    names = {c.name or (c.callback.__name__ if c.callback else "") for c in cli.app.registered_commands}
    if "rollout" in names:
        return [sys.executable, "-m", "polarproxy", "rollout", *args]
    code = "import typer; from polarproxy.commands.rollout import rollout; typer.run(rollout)"
    return [sys.executable, "-c", code, *args]


def run_rollout(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`polarproxy rollout ARGS` from the checkout's root; `env` is added to this process's environment."""
    return subprocess.run(
        rollout_argv(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )


def tools_path(*first: Path) -> dict[str, str]:
    """PATH with `first` and this interpreter's folder (the venv's python3 and pytest, for graders) ahead."""
    return {"PATH": os.pathsep.join([*map(str, first), str(Path(sys.executable).parent), os.environ["PATH"]])}


def bwrap_or_skip() -> None:
    """The sandbox tests need a working bwrap; in CI they fail without one rather than skip."""
    from polarproxy.rollout.sandbox import BwrapRunner

    why = BwrapRunner().probe()
    if why is not None:
        if IN_CI:
            pytest.fail(f"bwrap sandbox unavailable in CI: {why}")
        pytest.skip(why)
