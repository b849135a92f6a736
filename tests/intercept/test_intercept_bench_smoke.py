"""Smoke run of bench/intercept_overhead.py: it runs end to end and reports every figure (no timing checks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration  # a stand-in, a mitmdump and `polarproxy record --intercept`


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x == x


def test_quick_intercept_bench_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "intercept_overhead.py"), "--calls", "5", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["recorded_ok"] == r["recorded_expected"] == (5 + 5) * 2
    for kind in ("latency", "ttft"):
        for target in ("direct", "mitmproxy", "intercept"):
            row = r[kind][target]
            assert all(_number(row[k]) for k in ("p50_ms", "p99_ms", "added_p50_ms", "added_p99_ms")), row
        assert r[kind]["direct"]["added_p50_ms"] == 0
    assert all(_number(v) and v > 0 for v in r["cpu_ms_per_call"].values())
    assert isinstance(r["goal_met"], bool)
