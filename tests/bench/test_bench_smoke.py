"""Smoke run of the proxy-overhead benchmark: it runs end to end and reports every figure (no timing checks)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TARGETS = ("direct", "mitmproxy", "polarproxy")
PROXIES = ("mitmproxy", "polarproxy")

pytestmark = pytest.mark.integration  # starts a stub, a mitmdump and a polarproxy process


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x == x  # not NaN


@pytest.mark.skipif(
    not (Path(sys.executable).parent / "mitmdump").exists() and shutil.which("mitmdump") is None,
    reason="mitmdump is not installed",
)
def test_quick_bench_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "proxy_overhead.py"), "--quick", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "recorded ==" in proc.stdout  # the table was printed
    r = json.loads(out.read_text())

    for t in TARGETS:
        ns, st, tp = r["nonstream"][t], r["stream"][t], r["throughput"][t]
        assert ns["n"] == r["nonstream"]["rounds"] and ns["errors"] == 0
        assert st["n"] == r["stream"]["rounds"] and st["errors"] == 0
        assert tp["errors"] == 0
        for key in ("p50_ms", "p99_ms"):
            assert _number(ns[key]) and ns[key] > 0
        for key in ("ttfc_p50_ms", "ttfc_p99_ms", "total_p50_ms"):
            assert _number(st[key]) and st[key] > 0
        assert _number(tp["rps"]) and tp["rps"] > 0
    for p in PROXIES:
        for key in ("p50_ms", "p99_ms"):
            assert _number(r["nonstream"]["added"][p][key])
        for key in ("ttfc_p50_ms", "ttfc_p99_ms"):
            assert _number(r["stream"]["added"][p][key])
        # streaming is real through both proxies: the answer arrived in several pieces
        assert r["stream"][p]["reads_min"] > 1
        assert r["stream"]["streamed"][p] is True
        res = r["resources"][p]
        for phase in ("nonstream", "stream", "throughput"):
            assert _number(res["cpu_ms_per_call"][phase]) and res["cpu_ms_per_call"][phase] > 0
        assert res["rss_mb"] > 0 and res["hwm_mb"] >= res["rss_mb"]

    rec = r["recording"]
    assert rec["sent"] == r["throughput"]["requests"]
    assert rec["recorded"] == rec["sent"] == rec["recorded_ok"]
    assert rec["recorded_equals_sent"] is True
    assert rec["all_phases_recorded"] == rec["all_phases_sent"] == rec["all_phases_recorded_ok"]
    assert set(r["goals"]) == {"added_p50_ratio", "added_ttfc_ratio", "rps_ratio", "cpu_ratio", "rss_mb"}
    assert all(isinstance(g["met"], bool) for g in r["goals"].values())
