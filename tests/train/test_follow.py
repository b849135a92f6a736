"""`polarproxy train --follow` on a live gateway: a real `serve` (control API) over a real `polarproxy
backend`, episodes created and finished through the client while the trainer runs. It trains on each
whole group as it lands, syncs the backend after each step (so later calls carry the new version),
drops and counts the rows whose calls are older than the staleness bound, checkpoints on SIGINT with
exit 0, and resumes after the cursor it kept; a dead gateway or a bad token is an error."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from serving import ServeThread
from typer.testing import CliRunner

from polarproxy.client import Client, EpisodeHandle
from polarproxy.train.config import TrainConfig
from polarproxy.train.follow import FollowConfig, follow
from polarproxy.train.metrics import read_metrics

pytestmark = pytest.mark.integration
TOKEN = "follow-test-token"


def _app():
    import typer

    from polarproxy.commands.train import train_command

    app = typer.Typer(pretty_exceptions_show_locals=False)
    app.command("train")(train_command)
    app.command("noop", hidden=True)(lambda: None)  # keep `train` a named subcommand
    return app


def _run(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(_app(), ["train", *args], env=env)


def call(ep: EpisodeHandle) -> None:
    r = httpx.post(
        f"{ep.base_urls['openai']}/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        headers={"authorization": f"Bearer {ep.api_key}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text


def group(pp: Client, name: str) -> list[EpisodeHandle]:
    """Two episodes of one group, each with one call made now (at the backend's current version)."""
    eps = [pp.create_episode(task=name, group=name) for _ in range(2)]
    for ep in eps:
        call(ep)
    return eps


def finish(pp: Client, eps: list[EpisodeHandle]) -> None:
    for ep, reward in zip(eps, (1.0, 0.0), strict=True):  # unequal rewards: the group has advantages
        pp.finish_episode(ep.episode_id, exit_code=0, reward=reward)


def wait_for(predicate, what: str, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def backend_version(url: str) -> str:
    return httpx.get(f"{url}/model_info", timeout=10).json()["weight_version"]


@pytest.fixture
def gateway(random_model_dir: Path, make_backend, tmp_path: Path):
    backend = make_backend(random_model_dir, "--weight-version", "0", "--max-new-tokens-limit", "4")
    served = ServeThread(backend.url, random_model_dir, tmp_path / "follow.db", token=TOKEN)
    yield backend, served
    served.stop()


def test_follow_trains_groups_as_they_land_drops_stale_rows_and_checkpoints_on_sigint(
    gateway, random_model_dir: Path, tmp_path: Path
) -> None:
    backend, served = gateway
    out = tmp_path / "run"
    bad = _run("--follow", served.url, "--control-token", "not-the-token-x7", "--model", str(random_model_dir),
               "--out", str(out))  # fmt: skip
    assert (
        bad.exit_code == 1
        and "refused the control token" in bad.output
        and "not-the-token-x7" not in bad.output
    )

    pp = Client(served.url, TOKEN)
    a, b = group(pp, "A"), group(pp, "B")  # both sampled by version 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "polarproxy", "train", "--follow", served.url, "--model", str(random_model_dir),
         "--out", str(out), "--max-staleness", "0", "--sync", backend.url, "--sync-kind", "local",
         "--lr", "1e-3", "--device", "cpu", "--json"],
        env={**os.environ, "POLARPROXY_CONTROL_TOKEN": TOKEN},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()
    err: list[str] = []

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err.append(line)
            lines.put(line)

    threading.Thread(target=drain, daemon=True).start()
    try:
        while "following" not in lines.get(timeout=120):  # the model is loaded and it polls
            pass
        assert read_metrics(out) == []  # nothing has landed: no step
        finish(pp, a)  # group A lands while the trainer runs
        (m1,) = wait_for(lambda: read_metrics(out), "step 1")
        assert m1["step"] == 1 and m1["rows"] == 2 and m1["staleness_max"] == 0
        assert m1["synced_version"] == "1" and backend_version(backend.url) == "1"

        finish(pp, b)  # sampled by version 0, now 1 behind the trainer: past --max-staleness 0
        c = group(pp, "C")  # sampled by version 1
        finish(pp, c)
        m2 = wait_for(lambda: read_metrics(out)[1:], "step 2")[0]
        assert m2["step"] == 2 and m2["rows"] == 2 and m2["staleness_max"] == 0
        assert m2["rows_dropped_stale"] == 2 and m2["rows_received"] == 6
        assert backend_version(backend.url) == "2"
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    text = stdout + "".join(err)
    assert proc.returncode == 0, text
    assert "Traceback" not in text and TOKEN not in text
    summary = json.loads(stdout)
    assert summary["stopped"] == "signal" and summary["steps"] == 2 and summary["weight_version"] == "2"
    assert summary["rows_trained"] == 4 and summary["rows_dropped_stale"] == 2  # each row once or refused
    assert summary["rows_pending"] == 0 and summary["groups_received"] == 3
    assert Path(summary["checkpoint"]) == out / "step-2"
    meta = json.loads((out / "step-2" / "polarproxy.json").read_text())
    assert meta["weight_version"] == "2" and meta["follow"]["cursor"]

    # --resume goes on after the kept cursor: only the group that landed since is trained
    finish(pp, group(pp, "D"))
    cfg = TrainConfig(lr=1e-3, device="cpu", resume=True, steps=1)
    result = follow(random_model_dir, out, cfg, FollowConfig(served.url, TOKEN, max_staleness=0, wait_s=0.5))
    assert (result.steps, result.step, result.rows_received, result.rows_trained) == (1, 3, 2, 2)
    assert result.stopped == "steps" and result.checkpoint == out / "step-3"
    pp.close()


def test_an_unreachable_gateway_is_an_error_with_a_hint(random_model_dir: Path, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    res = _run("--follow", f"http://127.0.0.1:{port}", "--model", str(random_model_dir), "--out",
               str(tmp_path / "o"), env={"POLARPROXY_CONTROL_TOKEN": TOKEN})  # fmt: skip
    assert res.exit_code == 1, res.output
    assert "Error:" in res.output and f"127.0.0.1:{port}" in res.output and "polarproxy serve" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "o").exists()


@pytest.mark.parametrize("inputs", [[], ["--data", "rows.jsonl", "--follow", "http://127.0.0.1:9"]])
def test_follow_and_data_together_or_neither_is_a_usage_error(
    inputs: list[str], random_model_dir: Path, tmp_path: Path
) -> None:
    res = _run(*inputs, "--model", str(random_model_dir), "--out", str(tmp_path / "o"))
    assert res.exit_code == 2 and "--data FILE" in res.output and "--follow URL" in res.output
