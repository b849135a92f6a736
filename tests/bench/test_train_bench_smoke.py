"""Smoke runs of the training benchmarks at a small size: they run end to end and report every figure, and
the figures agree with the rows they built (no timing checks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration  # child processes, torch

pytest.importorskip("torch")


def _positive(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x > 0


def test_quick_train_step_bench_reports_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [
            *(sys.executable, str(REPO / "bench" / "train_step.py"), "--quick", "--rows", "8"),
            *("--calls", "20", "--episodes", "1", "--threads", "1", "--json", str(out)),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "packed / padded" in proc.stdout and "per-request / prefix-merge" in proc.stdout
    r = json.loads(out.read_text())
    layouts = r["layouts"]
    assert set(layouts) == {"packed", "padded", "padded-sorted", "trl"}
    real = layouts["packed"]["real_tokens"]
    assert layouts["packed"]["tokens_run"] == real and layouts["packed"]["padding_share"] == 0
    for name in ("padded", "padded-sorted"):
        assert layouts[name]["real_tokens"] == real and layouts[name]["tokens_run"] >= real
    for name, x in layouts.items():
        if "skipped" in x:
            assert name == "trl" and "trl" in x["skipped"]
            continue
        for key in ("tokens_per_s", "seconds_per_step"):
            assert _positive(x[key]), (name, key, x)
    assert _positive(r["packed_over_padded"])
    pr, pm = r["ablation"]["per-request"], r["ablation"]["prefix-merge"]
    assert pr["rows"] == 20 and pm["rows"] == 1
    assert pr["trainable_tokens"] == pm["trainable_tokens"]  # the same sampled tokens, both ways
    assert pr["tokens_per_episode"] > 5 * pm["tokens_per_episode"]  # per-request repeats each prompt
    assert _positive(pr["seconds_per_episode"]) and _positive(pm["seconds_per_episode"])


def test_gpu_train_bench_runs_on_the_cpu_with_the_tiny_shape(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [
            *(sys.executable, str(REPO / "bench" / "train_gpu.py"), "--device", "cpu", "--tiny"),
            *("--steps", "1", "--json", str(out)),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["size"] == "tiny" and r["device"] == "cpu" and r["mfu"] is None
    assert _positive(r["tokens_per_s"]) and _positive(r["model_tflops_per_s"]) and _positive(r["params"])
    assert r["tokens_per_step"] > r["trainable_tokens_per_step"] > 0
