"""Smoke run of the prompt-construction benchmark: it runs end to end over every real template and the
project's own, every follow-up call extends the one before (the bench fails otherwise), and it reports
every figure (no timing checks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO.parent / "shared" / "fixtures" / "chat-templates"


def test_quick_render_prefix_bench_reports_every_template_and_turn(tmp_path: Path) -> None:
    out = tmp_path / "render.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "render_prefix.py"), "--quick", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "prompt construction per call" in proc.stdout
    r = json.loads(out.read_text())
    expected = {"tiny", *(p.stem for p in TEMPLATES.glob("*.jinja"))}
    assert set(r["templates"]) == expected and len(expected) >= 2
    for rep in r["templates"].values():
        assert [c["turn"] for c in rep["calls"]] == r["turns"]
        tokens = [c["prompt_tokens"] for c in rep["calls"]]
        assert tokens == sorted(tokens) and tokens[0] < tokens[-1]  # the context grows turn by turn
        for c in rep["calls"]:
            assert all(c[k] > 0 for k in ("build_ms_median", "build_ms_max", "fresh_render_ms_median"))
        assert all(v > 0 for v in rep["steady"].values())
