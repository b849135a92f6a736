"""Honest groups (export/failures.py): a sample whose harness never reached the model is not a sample of the
policy. It fails its episode, makes `rollout` exit 1 naming it, and leaves its group in the export and the
trajectory stream (`excluded_failed`); a crash after the first call stays in the group at reward 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rollout_support import REPO, rollout_argv

from polarproxy.export.advantages import AdvantageOptions, compute_advantages
from polarproxy.store.records import Episode

HERE = Path(__file__).resolve().parent


def _ep(eid: str, reward, status="ok", exit_code=0) -> Episode:
    return Episode(eid, ["x"], None, None, "t", "g", reward, status, exit_code, 1.0, 2.0, {})


def test_the_taxonomy_in_the_advantages():
    eps = [
        _ep("ep_a_start_crash", None, "failed", 2),  # never reached the model: infra
        _ep("ep_b_late_crash", None, "failed", 3),  # crashed after a call, no reward: agent, 0.0
        _ep("ep_c_timeout", 0.0, "ok", 0),  # a verifier timeout: reward 0 from the verifier
        _ep("ep_d_solved", 1.0, "ok", 0),
        _ep("ep_e_interrupted", 1.0, "interrupted", None),  # its proxy died: infra
    ]
    answered = {"ep_b_late_crash": 1, "ep_c_timeout": 2, "ep_d_solved": 2, "ep_e_interrupted": 1}
    report = compute_advantages(eps, AdvantageOptions("grpo"), answered)
    assert sorted(report.excluded_failed) == ["ep_a_start_crash", "ep_e_interrupted"]
    assert set(report.advantages) == {"ep_b_late_crash", "ep_c_timeout", "ep_d_solved"}
    assert report.advantages["ep_b_late_crash"] == report.advantages["ep_c_timeout"] < 0
    assert report.summary()["excluded_failed"] == 2 and report.summary()["failed_as_zero"] == 1
    before = compute_advantages(eps, AdvantageOptions("grpo", failed_as_zero=True), answered)
    assert before.excluded_failed == [] and len(before.advantages) == 5  # --failed-as-zero: as before


def test_rollout_fails_a_sample_that_never_reached_the_model_and_the_export_leaves_it_out(
    stub_backend, tiny_model_dir, tmp_path
):
    ws = tmp_path / "t" / "workspace"
    ws.mkdir(parents=True)
    (ws / "README.md").write_text("t\n")
    verify = "python3 -c \"import sys; sys.exit(0 if open('answer.txt').read().startswith('Hello') else 1)\""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        json.dumps({"id": "t", "instruction": "greet", "workspace": str(ws), "verify": verify}) + "\n"
    )
    db = tmp_path / "r.db"
    args = [str(tasks), "--backend", stub_backend.url, "--model", str(tiny_model_dir), "--db", str(db)]
    args += ["--samples", "3", "--concurrency", "1", "--isolation", "none", "--json"]
    args += ["--pass-env", "TAXONOMY_COUNTER", "--", sys.executable, str(HERE / "taxonomy_agent.py")]
    env = {**os.environ, "TAXONOMY_COUNTER": str(tmp_path / "counter")}
    proc = subprocess.run(rollout_argv(*args), capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 1, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    states = sorted((e["state"], e["exit_code"]) for e in summary["episodes"])
    assert states == [("done", 0), ("done", 3), ("failed", 2)], summary["episodes"]
    assert "Error: 1 of 3 episodes failed" in proc.stderr and "never reached the model" in proc.stderr

    out = tmp_path / "rows.jsonl"
    export = [sys.executable, "-m", "polarproxy", "export", "--db", str(db), "--out", str(out)]
    export += ["--advantages", "grpo", "--json"]
    done = subprocess.run(export, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)["advantages"]
    assert counts["excluded_failed"] == 1 and counts["episodes"] == 2
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(round(r["advantage"], 4) for r in rows) == [-0.7071, 0.7071]  # the two samples, sample std
