"""Real processes for the audit's end-to-end tests: a scripted local backend, `polarproxy record` around a
harness, `polarproxy audit` as a subprocess; and the independent check of an audit's figures."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from factories import record_summary

from polarproxy.conversation import Conversation
from polarproxy.render.renderer import Renderer


@contextmanager
def scripted_backend(model_dir: Path, script: dict[str, Any], folder: Path) -> Iterator[str]:
    """`polarproxy backend --script` (see polarproxy/backends/local/script.py) on a free port; yields its URL."""
    path = folder / "script.json"
    path.write_text(json.dumps(script))
    cmd = [sys.executable, "-m", "polarproxy", "backend", "--model", str(model_dir), "--port", "0"]
    proc = subprocess.Popen(
        [*cmd, "--script", str(path)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stderr is not None
        lines = []
        for line in proc.stderr:
            lines.append(line)
            m = re.search(r"on (http://[\d.]+:\d+)", line)
            if m:
                threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep draining
                break
        else:
            raise RuntimeError("backend did not start:\n" + "".join(lines))
        yield m.group(1)
    finally:
        proc.kill()
        proc.wait(10)


def record(
    url: str, model: Path, db: Path, workspace: Path, argv: Sequence[str], *flags: str
) -> tuple[str, subprocess.CompletedProcess[str]]:
    """`polarproxy record` around `argv` in `workspace`; returns the episode ID and the process."""
    cmd = [sys.executable, "-m", "polarproxy", "record", "--backend", url, "--model", str(model)]
    r = subprocess.run(
        [*cmd, "--db", str(db), *flags, "--json", "--", *argv],
        cwd=workspace,
        env={**os.environ, "NO_COLOR": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return record_summary(r.stderr)["episode_id"], r


def audit(db: Path, *args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    """`polarproxy audit` as a subprocess, without POLARPROXY_MODEL (so the recorded folder is used)."""
    env = {k: v for k, v in os.environ.items() if k != "POLARPROXY_MODEL"}
    env["COLUMNS"] = str(columns)
    return subprocess.run(
        [sys.executable, "-m", "polarproxy", "audit", *args, "--db", str(db)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def first_diff(a: list[int], b: list[int]) -> int | None:
    """The plain definition, independent of polarproxy.audit."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_episode(ep: dict[str, Any], calls: list[Any], renderer: Renderer) -> int:
    """An episode of `audit --json` against our own fresh render of each call. Returns how many drift."""
    assert [c["call_id"] for c in ep["per_call"]] == [c.id for c in calls]
    drifted = drifted_tokens = 0
    for call, row in zip(calls, ep["per_call"], strict=True):
        fresh = renderer.render(Conversation.from_dict(call.conversation)).ids
        at = first_diff(call.prompt_ids, fresh)
        assert row["first_diff"] == at, (call.seq, row)
        assert row["result"] == ("identical" if at is None else "drifted")
        assert (row["recorded_tokens"], row["fresh_tokens"]) == (len(call.prompt_ids), len(fresh))
        assert row["drifted_tokens"] == (0 if at is None else len(call.prompt_ids) - at)
        assert row["unexpected"] is False and row["prefix_exact"] is not False
        drifted += at is not None
        drifted_tokens += row["drifted_tokens"]
    assert ep["drifted"] == drifted and ep["drifted_tokens"] == drifted_tokens
    assert ep["prompt_tokens"] == sum(len(c.prompt_ids) for c in calls)
    assert ep["drifted_share"] == pytest.approx(drifted_tokens / ep["prompt_tokens"], abs=1e-6)
    assert (ep["unexpected"], ep["prefix_breaks"], ep["skipped"]) == (0, 0, 0)
    return drifted
