"""The example SWE suite (examples/swe/): five SWE-bench-format instances made locally, rolled out in the
bwrap sandbox with the scripted `-- CMD` agent against the tiny model playing examples/swe/policy.yaml
(`backend --script`), under two hands of one policy (the agent's shell tool named as Qwen Code's and as
Claude Code's): each resolves the instances the policy fixes and no other, the gamed one included; the
grading (diff, per-test results) is stored; `compare` counts as a hand count does. `make demo-swe` runs the
same suite with the real CLIs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from rollout_support import REPO, bwrap_or_skip, run_rollout, tools_path

from polarproxy.store.store import Store

sys.path.insert(0, str(REPO / "examples" / "swe"))
import suite  # examples/swe/suite.py

SUITE = REPO / "examples" / "swe"
# what the policy resolves under each hand (examples/swe/policy.yaml's header)
RESOLVES = {
    "run_shell_command": {"acme__calc-1", "acme__text-2", "acme__dates-3"},
    "Bash": {"acme__calc-1", "acme__stack-4", "acme__config-5"},
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("swe")
    return suite.build(out)


def test_each_instance_is_made_as_swebench_makes_them(built: Path) -> None:
    rows = [json.loads(line) for line in built.read_text().splitlines()]
    assert [r["instance_id"] for r in rows] == [i.instance_id for i in suite.INSTANCES]
    for row, inst in zip(rows, suite.INSTANCES, strict=True):
        name = inst.name
        assert json.loads(row["FAIL_TO_PASS"]) == [
            f"tests/test_{name}.py::{inst.new_tests.split('def ')[1].split('(')[0]}"
        ]
        assert len(json.loads(row["PASS_TO_PASS"])) == 1
        repo = built.parent / "repos" / f"acme__{name}"
        fix = suite.git(repo, "rev-parse", "HEAD").strip()
        assert suite.git(repo, "rev-parse", "HEAD~1").strip() == row["base_commit"]  # the fix comes after it
        assert row["patch"] in suite.git(repo, "show", fix) and row["test_patch"].startswith(
            "diff --git a/tests/"
        )


@pytest.mark.parametrize("tool", list(RESOLVES))
def test_one_policy_resolves_what_it_fixes_under_each_hand(
    built: Path, make_backend, tiny_model_dir: Path, tmp_path: Path, tool: str
) -> None:
    bwrap_or_skip()
    backend = make_backend(tiny_model_dir, "--script", str(SUITE / "policy.yaml"))
    db = tmp_path / "swe.db"
    proc = run_rollout(
        *(str(built), "--repos", str(built.parent / "repos"), "--backend", backend.url),
        *(
            "--model",
            str(tiny_model_dir),
            "--db",
            str(db),
            "--concurrency",
            "2",
            "--rollout-id",
            "swe",
            "--json",
        ),
        *("--", "python", "examples/swe/agent.py", "--tool", tool),
        timeout=600,
        env={**tools_path(), "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)
    resolved = {task for task, t in summary["tasks"].items() if t["rewards"] == [1.0]}
    with Store.open(str(db)) as store:
        episodes = {e.task: e for e in store.list_episodes(limit=None)}
        graded = {task: store.list_rewards(e.id)[-1].origin for task, e in episodes.items()}
        told = {t: (episodes[t].calls, g.note, g.output_tail, g.patch) for t, g in graded.items()}
    assert resolved == RESOLVES[tool], told
    assert {t: g.grading["resolved"] for t, g in graded.items()} == {t: t in RESOLVES[tool] for t in episodes}
    assert all(set(e.stages) == {"prewarm", "execute", "evaluate"} for e in episodes.values()), episodes
    if tool == "run_shell_command":  # the gamed instance: its conftest.py left out, the new test fails
        config = graded["acme__config-5"]
        assert "1 steers-tests" in config.note and config.patch == "", config.note
        assert config.grading["tests"]["tests/test_config.py::test_yes_no"] == "FAILED"
        assert '+    return s.strip().lower() == "true"' not in graded["acme__text-2"].patch
        assert '+    return "-".join(s.lower().split())' in graded["acme__text-2"].patch
    else:  # dates: the fix breaks the test that passed before
        dates = graded["acme__dates-3"].grading["tests"]
        assert dates == {
            "tests/test_dates.py::test_centuries": "PASSED",
            "tests/test_dates.py::test_ordinary": "FAILED",
        }
    compared = subprocess.run(
        [sys.executable, "-m", "polarproxy", "compare", "--db", str(db), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert compared.returncode == 0, compared.stderr
    rows = json.loads(compared.stdout)["harnesses"]
    assert [(r["episodes"], r["resolved"]) for r in rows.values()] == [(5, 3)], rows  # one harness: (none)
    assert list(next(iter(rows.values()))["stage_s"]) == ["prewarm", "execute", "evaluate"]
    solved_by = json.loads(compared.stdout)["tasks"]
    assert {t for t, by in solved_by.items() if by} == RESOLVES[tool]
