"""Smoke run of the rollout-throughput benchmark at a tiny size: both modes run every episode to a reward of
1.0 through the real gateway, and every figure is reported (no timing checks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STAGES = ("prewarm", "execute", "evaluate", "reconstruct")

pytestmark = pytest.mark.integration  # a gateway and agent processes


def test_quick_rollout_bench_reports_every_figure(tmp_path: Path, random_model_dir: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "rollout_throughput.py"), "--quick", "--model",
         str(random_model_dir), "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "pipelined / baseline" in proc.stdout and "prewarm hidden behind execution" in proc.stdout
    r = json.loads(out.read_text())
    n = r["config"]["episodes"]
    assert (
        r["lengths"]["min_s"] >= r["config"]["base_s"] and r["lengths"]["max_s"] <= 10 * r["config"]["base_s"]
    )
    for mode in ("pipelined", "baseline"):
        (run,) = r["runs"][mode]
        assert run["episodes"] == run["done"] == n
        assert run["wall_s"] > 0 and run["episodes_per_hour"] > 0
        assert 0 < run["utilisation"] <= 1
        assert run["execute_busy_slot_s"] <= r["config"]["concurrency"] * run["wall_s"]
        assert run["idle_waiting_fill_slot_s"] >= 0 and run["idle_waiting_steady_slot_s"] >= 0
        assert set(run["queue_s"]) == set(STAGES)
        assert isinstance(run["prewarm_hidden"], bool)
    assert r["ratio"] == pytest.approx(
        r["episodes_per_hour"]["pipelined"] / r["episodes_per_hour"]["baseline"], rel=1e-2
    )
    assert set(r["met"]) == {"ratio", "utilisation"} and len(r["load_average"]) == 3
