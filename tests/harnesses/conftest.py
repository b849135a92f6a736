"""Fixture `record_harness`: a real harness CLI under `polarproxy record --harness NAME`, read back."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import pytest
from factories import record_summary
from recording import Recorded

from polarproxy.harness.env import PLACEHOLDER_KEY
from polarproxy.store.store import Store


@pytest.fixture
def record_harness(backend, tiny_model_dir, tmp_path) -> Callable[..., Recorded]:
    """record_harness(preset, argv, *record_flags) runs `polarproxy record --harness preset ... -- argv`
    in a small workspace (README.md, hello.py) and asserts it exited 0. `backend_url` defaults to the
    session's sampling backend."""

    def run(
        preset: str,
        argv: Sequence[str],
        *flags: str,
        env: dict[str, str] | None = None,
        backend_url: str | None = None,
    ) -> Recorded:
        ws = tmp_path / "ws"
        ws.mkdir(exist_ok=True)
        (ws / "README.md").write_text("# hello\n")
        (ws / "hello.py").write_text("print('hello')\n")
        db = tmp_path / f"{preset}.db"
        cmd = [sys.executable, "-m", "polarproxy", "record", "--backend", backend_url or backend.url]
        cmd += ["--model"]
        cmd += [str(tiny_model_dir), "--db", str(db), "--harness", preset, *flags, "--json", "--", *argv]
        t0 = time.perf_counter()
        r = subprocess.run(
            cmd,
            cwd=ws,
            # PWD as a shell would set it: some harnesses (OpenCode) take their project folder from it
            env={**os.environ, "NO_COLOR": "1", "PWD": str(ws), **(env or {})},
            capture_output=True,
            text=True,
            timeout=600,
            stdin=subprocess.DEVNULL,
        )
        seconds = time.perf_counter() - t0
        assert r.returncode == 0, (
            f"exit {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
        )
        summary = record_summary(r.stderr)
        store = Store.open(str(db))
        rec = Recorded(
            r, store.get_episode(summary["episode_id"]), store.list_calls(summary["episode_id"]), db, seconds
        )
        print(f"{preset}: {len(rec.calls)} calls in {seconds:.1f} s")
        assert rec.calls, f"{preset} made no model call through the proxy\n{rec.tails()}"
        assert rec.episode.harness == preset and rec.episode.status == "ok"
        for f in tmp_path.glob(f"{preset}.db*"):
            assert PLACEHOLDER_KEY.encode() not in f.read_bytes(), f"the placeholder key reached {f.name}"
        return rec

    return run
