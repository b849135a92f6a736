"""prefix-merge on an episode recorded through the real Codex CLI (npm @openai/codex), unmodified.

Codex runs a scripted two-command tool loop against the local backend (Responses API, streamed). Each of
its agent turns extends the one before (T2), so `polarproxy export --strategy prefix-merge` turns the
linear episode into one trajectory: one trainer sequence instead of one per call. Calls that offer no
tools (side requests: titles, routers) would be trajectories of their own; Codex in exec mode sends none,
and any it sends is checked to be its own trajectory. Every trainable logprob of the merged sequence
matches one teacher-forced forward pass of the model over that sequence within 1e-4: the row is what a
trainer would score.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from recording import BIN, check_calls, check_tool_loops, main_calls, needs_cli, scripted_backend

from polarproxy.export import read_parquet_rows
from polarproxy.reconstruct import assert_round_trip, prefix_merge

pytestmark = [pytest.mark.integration, needs_cli("codex", "Codex CLI")]


def test_codex_episode_is_one_trajectory_whose_logprobs_match_a_forward_pass(
    record_harness, make_backend, tiny_model_dir, tmp_path
):
    from polarproxy.backends.local.model_runner import ModelRunner

    url = scripted_backend(
        make_backend,
        tiny_model_dir,
        tmp_path,
        "exec_command",
        {"cmd": "ls"},
        ("exec_command", {"cmd": "cat README.md"}),
    )
    rec = record_harness(
        "codex",
        [
            str(BIN / "codex"),
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "List the files, read README.md, then say done.",
        ],
        backend_url=url,
    )
    check_calls(rec, tiny_model_dir, dialect="openai_responses", auth_header="authorization")
    main = check_tool_loops(rec, ["exec_command", "exec_command"], ["hello.py", "# hello"])
    assert len(main) == 3

    trajs = list(prefix_merge(rec.calls))
    by_id = {c.id: c for c in rec.calls}
    assert sorted(c for t in trajs for c in t.call_ids) == sorted(by_id)  # T3
    agent = [t for t in trajs if any(by_id[c].has_tools for c in t.call_ids)]
    assert len(agent) == 1, [t.call_ids for t in trajs]
    (traj,) = agent
    assert traj.call_ids == [c.id for c in main_calls(rec)]
    assert all(len(t.call_ids) == 1 for t in trajs if t is not traj)  # side requests, if any: alone
    for t in trajs:
        assert_round_trip(t, [by_id[c] for c in t.call_ids])  # T4

    # The merged row scores like the model: one teacher-forced pass over the whole sequence.
    scored = ModelRunner(tiny_model_dir).score(traj.input_ids[:1], traj.input_ids[1:])
    pairs = enumerate(zip(traj.loss_mask, traj.logprobs, strict=True))
    gaps = [abs(scored[i - 1] - lp) for i, (m, lp) in pairs if m]
    assert len(gaps) == sum(len(by_id[c].output_ids) for c in traj.call_ids) > 0
    print(f"{len(gaps)} trainable tokens; max |logprob - teacher-forced| = {max(gaps):.2e}")
    assert max(gaps) < 1e-4, max(gaps)

    # The same through the command, to Parquet, with its statistics.
    out = tmp_path / "merged.parquet"
    e = subprocess.run(
        [
            *(sys.executable, "-m", "polarproxy", "export", "--db", str(rec.db)),
            *("--strategy", "prefix-merge", "--format", "parquet", "--out", str(out), "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert e.returncode == 0, e.stderr
    stats = json.loads(e.stdout)
    assert stats["calls"] == len(rec.calls) and stats["trajectories"] == len(trajs)
    assert stats["sequence_ratio"] == len(rec.calls) / len(trajs)
    assert stats["per_request_tokens"] == sum(len(c.prompt_ids) + len(c.output_ids) for c in rec.calls)
    rows = list(read_parquet_rows(out))
    merged = next(r for r in rows if r["call_ids"] == traj.call_ids)
    assert merged["input_ids"] == traj.input_ids and merged["loss_mask"] == traj.loss_mask
    assert merged["logprobs"] == traj.logprobs
