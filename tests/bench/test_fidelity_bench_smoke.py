"""Smoke run of the re-tokenization ablation on the real Qwen3 template: a recorded tool episode in which
every follow-up call extends the one before (polarproxy's prefix breaks: 0), while a fresh re-render of
the same conversations (what a re-tokenizing system would feed) differs from what the model saw once the
agent drops the reasoning it got back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from factories import shared_template

REPO = Path(__file__).resolve().parents[2]


def test_quick_ablation_shows_zero_prefix_breaks_against_re_tokenizing_drift(tmp_path: Path) -> None:
    shared_template("qwen3")
    out = tmp_path / "ablation.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "fidelity_ablation.py"), "--quick", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(out.read_text())["templates"]
    assert [(r["template"], r["reasoning_sent_back"]) for r in rows] == [("qwen3", True), ("qwen3", False)]
    for r in rows:
        assert r["calls"] == r["extended_calls"] + 1 and r["fresh_later_calls"] == 0
        assert r["polarproxy_prefix_breaks"] == 0 and r["prompt_tokens"] > 0
    dropped = rows[1]
    assert dropped["retokenized_drifted_tokens"] > 0 and dropped["drifted_calls"] > 0
