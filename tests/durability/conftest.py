"""Real processes for crash and outage tests: `polarproxy record`/`serve` as subprocesses, a fixed-time
backend double in a thread, and each test's own spool folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from proc_helpers import Served, StubThread, drain_lines

from polarproxy.backends.stub import StubConfig


@pytest.fixture
def reply_ids(tiny_model_dir: Path) -> list[int]:
    """The token IDs the backend double answers with (the tiny tokenizer's 'Hello there.' + stop)."""
    from polarproxy.render.renderer import Renderer

    renderer = Renderer(tiny_model_dir)
    return [*renderer.encode("Hello there."), renderer.stop_token_ids[0]]


@pytest.fixture
def stub(reply_ids: list[int]) -> Iterator[StubThread]:
    s = StubThread(StubConfig(output_ids=reply_ids))
    yield s
    s.stop()


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment of the polarproxy subprocesses: this test's own spool folder and data dir (this
    process reads the same spool folder)."""
    monkeypatch.setenv("POLARPROXY_SPOOL_DIR", str(tmp_path / "spool"))
    e = dict(os.environ)
    e["XDG_DATA_HOME"] = str(tmp_path / "data")
    e.pop("POLARPROXY_DB", None)
    return e


@pytest.fixture
def serve(tiny_model_dir: Path, env: dict[str, str]) -> Iterator[Callable[..., Served]]:
    """serve(backend_url, db, *extra) -> `polarproxy serve` in a subprocess, stopped (SIGTERM) at teardown."""
    started: list[Served] = []

    def start(backend_url: str, db: str, *extra: str) -> Served:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "polarproxy", "serve", "--backend", backend_url),
                *("--model", str(tiny_model_dir), "--db", db, "--port", "0", *extra),
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        assert proc.stderr is not None
        lines: list[str] = []
        for line in proc.stderr:
            lines.append(line)
            m = re.search(r"recording on (http://[\d.]+:\d+) \(default episode (\S+)\)", line)
            if m:
                threading.Thread(target=drain_lines, args=(proc.stderr, lines), daemon=True).start()
                s = Served(proc, m.group(1), m.group(2), lines)
                started.append(s)
                return s
        proc.wait(10)
        raise RuntimeError("polarproxy serve did not start:\n" + "".join(lines))

    yield start
    for s in started:
        s.stop()
