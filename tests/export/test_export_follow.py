"""`export --follow URL`: a real `serve` gateway's trajectory stream written as files while episodes finish,
in a trainer's format, numbered on across restarts from the saved cursor, and the CLI until Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest
from serving import ServeThread, Stub

from polarproxy.client import Client
from polarproxy.errors import UsageError
from polarproxy.export.follow import STATE, ExportFollowConfig, follow_export

TOKEN = "follow-export-token"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def served(tiny_model_dir, tmp_path):
    stub = Stub(tiny_model_dir)
    s = ServeThread(stub.url, tiny_model_dir, tmp_path / "f.db", token=TOKEN)
    yield s
    s.stop()
    stub.stop()


def _group(served: ServeThread, name: str, rewards: tuple[float, ...]) -> list[str]:
    made = []
    with Client(served.url, TOKEN) as pp:
        for r in rewards:
            ep = pp.create_episode(task=name, group=name, harness="test")
            res = httpx.post(
                f"{ep.base_urls['openai']}/chat/completions",
                json={"messages": [{"role": "user", "content": f"{name} {r}"}]},
                headers={"authorization": f"Bearer {ep.api_key}"},
                timeout=30,
            )
            assert res.status_code == 200, res.text
            pp.finish_episode(ep.episode_id, exit_code=0, reward=r)
            made.append(ep.episode_id)
    return made


def _follow_until(cfg: ExportFollowConfig, files: int) -> list[str]:
    """Run follow_export until it has written `files` files; the files it wrote."""
    stop = threading.Event()
    got: list[str] = []

    def written(paths: list[str], _stats) -> None:
        got.extend(paths)
        if len(got) >= files:
            stop.set()

    result: list = []
    t = threading.Thread(target=lambda: result.append(follow_export(cfg, stop, written)))
    t.start()
    t.join(60)
    stop.set()
    t.join(10)
    assert result and result[0].files == got, (result, got)
    return got


def test_the_stream_lands_as_numbered_files_and_a_restart_goes_on_after_them(served, tmp_path):
    pytest.importorskip("torch")
    import torch

    a = _group(served, "ga", (1.0, 0.0))
    b = _group(served, "gb", (0.0, 1.0))
    out = tmp_path / "openrlhf"
    cfg = ExportFollowConfig(url=served.url, out=out, fmt="openrlhf", token=TOKEN, wait_s=0.2)
    (first,) = _follow_until(cfg, 1)
    assert Path(first) == out / "000000.jsonl"
    lines = [orjson.loads(x) for x in Path(first).read_bytes().splitlines()]
    assert sorted(x["polarproxy"]["episode_id"] for x in lines) == sorted(a + b)
    assert sorted(x["advantage"] for x in lines) == pytest.approx(
        [-(0.5**0.5)] * 2 + [0.5**0.5] * 2, abs=1e-5
    )
    for x in lines:
        assert len(x["rollout_log_probs"]) == len(x["observation_tokens"]) and len(x["action_ranges"]) == 1
    state = json.loads((out / STATE).read_text())
    assert (
        state["next_file"] == 1 and state["format"] == "openrlhf" and TOKEN not in (out / STATE).read_text()
    )

    c = _group(served, "gc", (1.0, 0.0))  # after a restart: only what landed since, in the next file
    (second,) = _follow_until(cfg, 1)
    assert Path(second) == out / "000001.jsonl"
    assert sorted(
        orjson.loads(x)["polarproxy"]["episode_id"] for x in Path(second).read_bytes().splitlines()
    ) == sorted(c)

    with pytest.raises(UsageError, match="another follow"):  # the folder of another format
        follow_export(ExportFollowConfig(url=served.url, out=out, fmt="verl", token=TOKEN), threading.Event())

    steps = tmp_path / "slime"
    scfg = ExportFollowConfig(
        url=served.url, out=steps, fmt="slime", token=TOKEN, wait_s=0.2, groups_per_file=1
    )
    files = _follow_until(scfg, 3)
    assert files == [str(steps / f"{i}.pt") for i in range(3)]
    for i, f in enumerate(files):
        data = torch.load(f, weights_only=False)
        assert data["rollout_id"] == i and len(data["samples"]) == 2
        assert len({s["group_index"] for s in data["samples"]}) == 1
    assert not [p for p in os.listdir(steps) if p.endswith(".tmp")]


def test_the_cli_follows_until_ctrl_c_and_names_a_refused_token(served, tmp_path):
    _group(served, "ga", (1.0, 0.0))
    out = tmp_path / "trl"
    argv = [sys.executable, "-m", "polarproxy", "export", "--follow", served.url, "--format", "trl"]
    argv += ["--out", str(out), "--json"]
    env = {**os.environ, "POLARPROXY_CONTROL_TOKEN": TOKEN}
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not (out / "000000.jsonl").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    summary = json.loads(stdout)
    assert summary["files"] == [str(out / "000000.jsonl")] and summary["rows"] == 2
    assert TOKEN not in stdout + stderr
    rows = [orjson.loads(x) for x in (out / "000000.jsonl").read_bytes().splitlines()]
    assert {r["group_id"] for r in rows} == {"group:ga"} and len(rows[0]["env_mask"]) == len(
        rows[0]["completion_ids"]
    )

    env["POLARPROXY_CONTROL_TOKEN"] = "wrong"
    res = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "refused the control token" in res.stderr and "Traceback" not in res.stderr
    res = subprocess.run(
        [*argv, "--status", "ok"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 2 and "--status" in res.stderr
