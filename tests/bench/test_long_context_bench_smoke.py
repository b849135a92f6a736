"""Smoke run of the long-context benchmark at a small size: the real `polarproxy serve` in front of the stub
backend with the real Qwen3 template, every follow-up call extends the one before (T2; the bench fails
otherwise), and every figure is reported (no timing checks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration  # a stub backend and a proxy process


def test_quick_long_context_bench_reports_every_figure_and_extends_every_follow_up(tmp_path: Path) -> None:
    out = tmp_path / "long.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "long_context.py"), "--quick", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "every follow-up extended: True" in proc.stdout
    r = json.loads(out.read_text())
    st = r["store"]
    assert st["all_follow_ups_extended"] and st["follow_ups"] == st["extended"] > 0
    assert st["calls"] == st["first_calls"] + st["follow_ups"] == r["proxy"]["calls"] + r["config"]["warmup"]
    f, cfg = r["figures"], r["config"]
    assert f["1k"]["prompt_tokens_max"] < cfg["measure_from"] <= f["32k"]["prompt_tokens_min"]
    for case in ("1k", "32k"):
        g = f[case]
        assert g["calls"] > 0
        assert all(g[k] > 0 for k in ("proxy_p50_ms", "direct_p50_ms", "proxy_p99_ms", "cpu_ms_per_call"))
        assert {"added_p50_ms", "added_p99_ms", "paired_added_p50_ms"} <= set(g)
    assert set(f["ratio_32k_over_1k"]) == set(f["met"]) == {"added_p50", "added_p99", "cpu_per_call"}
    assert f["ratio_32k_over_1k"]["cpu_per_call"] == pytest.approx(
        f["32k"]["cpu_ms_per_call"] / f["1k"]["cpu_ms_per_call"], abs=0.01
    )
    assert sum(b["calls"] for b in f["long_episode_by_prompt_tokens"].values()) == cfg["long_turns"] - 1
    assert len(r["host"]["loadavg_before"]) == 3 and r["proxy"]["rss_mb"] > 0
