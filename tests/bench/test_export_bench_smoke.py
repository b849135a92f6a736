"""Smoke run of the export benchmark at a small size: it runs end to end and reports every figure, and the
figures are consistent with the synthetic store it built (no timing checks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUNS = [
    ("read", "none", "plain"),
    ("read", "none", "arrays"),
    *(
        (strategy, fmt, path)
        for strategy in ("per-request", "prefix-merge")
        for fmt in ("jsonl", "parquet")
        for path in ("plain", "arrays", "jobs2")
    ),
    *(("prefix-merge", fmt, "arrays") for fmt in ("slime", "verl", "trl", "nemo-rl", "openrlhf")),
]
ROW_RUNS = RUNS[: 2 + 12]  # the row formats, three paths each

pytestmark = pytest.mark.integration  # child processes, the tiny model's tokenizer


def _positive(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x > 0


def test_small_export_bench_reports_every_figure(tmp_path: Path, tiny_model_dir: Path) -> None:
    out = tmp_path / "bench.json"
    episodes, calls, context = 6, 5, 400
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "export_speed.py"),
            *("--episodes", str(episodes), "--calls", str(calls), "--context", str(context)),
            *("--turns", "6", "--model", str(tiny_model_dir)),
            *("--db", str(tmp_path / "b.db"), "--json", str(out)),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Prompt construction" in proc.stdout
    r = json.loads(out.read_text())
    assert [(x["strategy"], x["format"], x["path"]) for x in r["exports"]] == RUNS
    growth = context // calls
    per_episode = sum(growth * (i + 1) for i in range(calls))  # call i holds i+1 growth steps
    for x in r["exports"]:
        s = x["stats"]
        assert s["calls"] == episodes * calls
        assert s["per_request_tokens"] == episodes * per_episode
        for key in (
            "seconds",
            "cpu_seconds",
            "recorded_tokens_per_s",
            "recorded_tokens_per_cpu_s",
            "peak_rss_mb",
        ):
            assert _positive(x[key]), (key, x)
        if x["strategy"] == "per-request":
            assert s["trajectories"] == episodes * calls and s["total_tokens"] == s["per_request_tokens"]
        if x["strategy"] == "prefix-merge":  # every synthetic episode is one chain
            assert s["trajectories"] == episodes and s["sequence_ratio"] == calls
            assert s["total_tokens"] == episodes * growth * calls
        if x["strategy"] != "read":
            assert s["trainable_tokens"] == episodes * calls * max(1, growth // 4)
            assert _positive(x["exported_tokens_per_s"]) and _positive(x["exported_tokens_per_cpu_s"])
            assert _positive(x["file_bytes"])
    by_run = {(x["strategy"], x["format"], x["path"]): x for x in r["exports"]}
    merged = by_run["prefix-merge", "jsonl", "arrays"]["stats"]
    for fmt in (
        "slime",
        "verl",
        "trl",
        "nemo-rl",
        "openrlhf",
    ):  # the same trajectories in each trainer's names
        s = by_run["prefix-merge", fmt, "arrays"]["stats"]
        assert {k: s[k] for k in ("rows", "calls", "trainable_tokens", "total_tokens")} == {
            k: merged[k] for k in ("rows", "calls", "trainable_tokens", "total_tokens")
        }, fmt
    for strategy, fmt, _path in ROW_RUNS[2::3]:  # the array path (in one or two jobs) writes the plain path's
        plain, arrays = by_run[strategy, fmt, "plain"], by_run[strategy, fmt, "arrays"]
        jobs2 = by_run[strategy, fmt, "jobs2"]
        assert arrays["stats"] == plain["stats"] and arrays["file_bytes"] == plain["file_bytes"]
        assert jobs2["stats"] == arrays["stats"] and jobs2["file_bytes"] == arrays["file_bytes"]
        assert jobs2["jobs"] == 1  # 30 calls: too few for two jobs
    p = r["prompts"]
    assert p["mode"] == {"1": "fresh", "2": "extended", "6": "extended"}
    assert p["context_tokens"]["6"] > p["context_tokens"]["2"] > p["context_tokens"]["1"]
    assert all(_positive(ms) for ms in [*p["per_turn_ms"].values(), *p["per_turn_cpu_ms"].values()])
    assert _positive(p["ratio_last_to_turn1"]) and _positive(p["cpu_ratio_last_to_turn1"])
    assert _positive(p["fresh_render_last_ms"])
