"""Smoke run of the serve-memory benchmark at a small size: a real `polarproxy serve` with episodes opened
in steps, RSS read at each step and set against the documented formula, every follow-up call extended
(the bench fails otherwise); no memory figure is checked, only that each is reported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration  # a stub backend and a proxy process


def test_quick_serve_memory_bench_reports_every_point_against_the_formula(tmp_path: Path) -> None:
    out = tmp_path / "mem.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "serve_memory.py"), "--quick", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    n, calls = r["config"]["episodes"], r["config"]["calls_per_episode"]
    st = r["store"]
    assert st["all_follow_ups_extended"] and st["extended"] == st["follow_ups"] == n * (calls - 1)
    points = r["points"]
    assert [p["episodes"] for p in points] == sorted({0, n // 8, n // 4, n // 2, n})
    assert points[-1]["calls"] == n * calls
    for p in points:
        assert p["rss_mb"] > 0 and p["hwm_mb"] >= p["rss_mb"] and p["formula_mb"] > 0 and "error_pct" in p
    pe = r["per_episode"]
    assert pe["index_bytes"] > 4 * pe["context_tokens"] and pe["store_bytes"] > 4 * pe["context_tokens"]
    assert pe["context_tokens"] >= 0.9 * r["config"]["context"]
    assert (
        set(r["fit"]) == {"base_mb", "per_episode_mb"} and r["worst_case"]["bound_mb"] > points[0]["rss_mb"]
    )
