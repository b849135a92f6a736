"""Smoke run of the streaming benchmark per wire format: tiny sizes, behaviour only (no timing checks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DIALECTS = ("openai_chat", "openai_responses", "anthropic", "gemini")

pytestmark = pytest.mark.integration  # starts a stub and a polarproxy process


def _number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x == x  # not NaN


def test_stream_bench_reports_every_format(tmp_path: Path) -> None:
    out = tmp_path / "stream.json"
    tokens, rounds = 12, 2
    argv = [sys.executable, str(REPO / "bench" / "stream_dialects.py"), "--tokens", str(tokens)]
    argv += ["--rounds", str(rounds), "--warmup", "1", "--per-token-ms", "5", "--json", str(out)]
    proc = subprocess.run(
        argv,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "added TTFT p50 ms" in proc.stdout  # the table was printed
    r = json.loads(out.read_text())
    assert r["config"]["tokens"] == tokens
    for t in ("direct", "mitmproxy", *DIALECTS):
        s = r["targets"][t]
        assert s["n"] == rounds and s["errors"] == 0, (t, s)
        for key in ("ttft_p50_ms", "ttft_p99_ms", "total_p50_ms"):
            assert _number(s[key]) and s[key] > 0, (t, key, s)
        # streamed, not assembled after the fact: the content came in several separate reads
        assert 1 < s["content_reads_min"] <= s["chunks_min"] <= tokens, (t, s)
    # the baseline: bare mitmproxy passing the backend's own stream, its CPU measured as polarproxy's is
    assert r["targets"]["mitmproxy"]["cpu_ms_per_chunk"] > 0
    assert _number(r["added"]["mitmproxy"]["ttft_p50_ms"])
    for d in DIALECTS:
        assert r["targets"][d]["text_ok"] is True, d  # the client reassembled exactly the generated text
        assert r["targets"][d]["cpu_ms_per_chunk"] > 0
        for key in ("ttft_p50_ms", "ttft_p99_ms", "ttft_paired_p50_ms", "per_chunk_ms"):
            assert _number(r["added"][d][key]), (d, key)
        ratio = r["added"][d]["ttft_ratio"]  # None only where mitmproxy's own added TTFT came out <= 0
        assert ratio is None or _number(ratio), ratio
        assert set(r["goals"][d]) == {"added_ttft_p50_ms", "added_ttft_ratio", "chunk_share_min"}
        assert all(isinstance(g["met"], bool) for g in r["goals"][d].values())


def test_sglang_stream_read_bench_reads_both_ways_alike(tmp_path: Path) -> None:
    out = tmp_path / "read.json"
    argv = [sys.executable, str(REPO / "bench" / "sglang_stream_read.py"), "--tokens", "64,300"]
    proc = subprocess.run(
        [*argv, "--rounds", "1", "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "cumulative per-token CPU, 300 over 64 tokens" in proc.stdout
    r = json.loads(out.read_text())
    assert [row["tokens"] for row in r["rows"]] == [64, 300]
    for row in r["rows"]:
        for kind in ("cumulative", "incremental"):
            assert row[kind]["cpu_s"] > 0 and row[kind]["bytes"] > 0
        assert row["cumulative"]["bytes"] > row["incremental"]["bytes"]  # every event repeats the answer
    assert _number(r["per_token_growth"])
