"""Helpers for crash and outage tests: the backend double in a thread, `polarproxy serve` as a subprocess,
waiting, and running the real CLI."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from polarproxy.backends.stub import StubBackend, StubConfig


class StubThread:
    """The backend double on its own event loop; `cfg` may be changed while it runs (e.g. made slow)."""

    def __init__(self, cfg: StubConfig) -> None:
        self.cfg = cfg
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.stub = StubBackend(cfg)
        port = asyncio.run_coroutine_threadsafe(self.stub.start(), self.loop).result(10)
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.stub.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass
class Served:
    proc: subprocess.Popen[str]
    url: str
    episode_id: str
    stderr: list[str]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def drain_lines(stream, into: list[str]) -> None:
    for line in stream:
        into.append(line)


def wait_for(
    pred: Callable[[], object],
    timeout: float = 30.0,
    what: str = "condition",
    detail: Callable[[], str] | None = None,
) -> None:
    """Wait until `pred()` holds; a bound on a slow shared machine, not a timing under test."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(
        f"timed out after {timeout} s waiting for {what}" + (f"\n{detail()}" if detail else "")
    )


def polarproxy(*args: str, env: dict[str, str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real CLI."""
    return subprocess.run(
        [sys.executable, "-m", "polarproxy", *args],
        capture_output=True,
        text=True,
        env=env,
        input=stdin,
        timeout=120,
        check=False,
    )
