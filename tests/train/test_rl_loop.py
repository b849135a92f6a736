"""The RL loop closed on a CPU (examples/rl_loop.py, `make demo-rl`): the real gateway records G samples per
task, verifiers post rewards, `export --advantages grpo` and `train --sync` update the backend's weights,
and the mean reward rises; with `--lr 0` it does not move (each sample keeps its seed across iterations)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from polarproxy.store.store import Store

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def run_loop(tmp: Path, *args: str) -> dict:
    out = tmp / "run"
    result = tmp / "curve.json"
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "rl_loop.py"),
            "--out",
            str(out),
            "--json",
            str(result),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (out / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return json.loads(result.read_text())


def test_grpo_raises_the_mean_reward_and_each_call_carries_the_weights_it_was_sampled_with(tmp_path):
    data = run_loop(tmp_path, "--iterations", "4", "--tasks", "8", "--samples", "8", "--lr", "0.02")
    rewards = [c["reward_mean"] for c in data["curve"]]
    assert all(c["samples"] == 64 for c in data["curve"])
    start, best = rewards[0], max(rewards[1:])
    assert 0.1 <= start <= 0.6, rewards
    assert best >= start + 0.3 and best >= 1.5 * start, rewards
    versions = [c["weight_version"] for c in data["curve"]]
    assert versions[0] == "0" and [int(v) for v in versions] == sorted({int(v) for v in versions}), versions
    store = Store.open(data["db"])
    for point in data["curve"]:  # every call of an iteration was sampled by that iteration's weights
        episodes = store.list_episodes(limit=None)
        calls = [
            c
            for e in episodes
            if e.metadata.get("iteration") == str(point["iteration"])
            for c in store.list_calls(e.id)
        ]
        assert len(calls) == 64 and {c.weight_version for c in calls} == {point["weight_version"]}
        assert all(c.status == "ok" and len(c.output_logprobs) == len(c.output_ids) for c in calls)


def test_with_lr_0_the_reward_stays_where_it_started(tmp_path):
    data = run_loop(tmp_path, "--iterations", "3", "--tasks", "8", "--samples", "8", "--lr", "0")
    rewards = [c["reward_mean"] for c in data["curve"]]
    assert all(abs(r - rewards[0]) <= 0.1 for r in rewards), rewards
    assert [c["weight_version"] for c in data["curve"]][-1] != "0"  # it did train and sync, with lr 0
