"""SWE-bench instances as a rollout source, on a small repository made here (a bug, its fix and the test
that shows it committed after the base): the workspace is the base commit alone, with nothing after it
reachable; grading resets and applies the test patch on a clean copy with the agent's changes, runs the
tests and reads pytest's -rA lines; an agent that fixes the bug is resolved, one that edits the tests or
adds a conftest.py is not; a bad source is an error naming the row, and nothing runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_stages import MemoryEpisodes, _settings

from polarproxy.rollout.run import Plan, Rollout
from polarproxy.rollout.sources import load_source
from polarproxy.rollout.tasks import TaskError


class Episodes(MemoryEpisodes):
    def prior(self, rollout_id, groups):
        return []


BUGGY = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"
TESTS_BASE = "from calc import sub\n\n\ndef test_sub():\n    assert sub(3, 1) == 2\n"
TESTS_NEW = (
    TESTS_BASE.replace("import sub", "import add, sub") + "\n\ndef test_add():\n    assert add(2, 2) == 4\n"
)


def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@x",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@x",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout


@pytest.fixture
def instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path, str]:
    """(the instances file, the --repos folder, the gold commit)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv(
        "PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    )  # pytest's python3
    repo = tmp_path / "repos" / "acme__calc"
    (repo / "tests").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "calc.py").write_text(BUGGY)
    (repo / "tests" / "test_calc.py").write_text(TESTS_BASE)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "tests" / "test_calc.py").write_text(TESTS_NEW)
    test_patch = _git(repo, "diff")
    (repo / "calc.py").write_text(BUGGY.replace("return a - b\n\n\ndef sub", "return a + b\n\n\ndef sub"))
    _git(repo, "commit", "-q", "-am", "fix add (the gold patch and its test)")
    gold = _git(repo, "rev-parse", "HEAD").strip()
    row = {
        "instance_id": "acme__calc-1",
        "repo": "acme/calc",
        "base_commit": base,
        "problem_statement": "add() subtracts instead of adding.",
        "test_patch": test_patch,
        "FAIL_TO_PASS": json.dumps(["tests/test_calc.py::test_add"]),  # a JSON string, as SWE-bench's files
        "PASS_TO_PASS": ["tests/test_calc.py::test_sub"],
        "version": "1.0",
    }
    source = tmp_path / "instances.jsonl"
    source.write_text(json.dumps(row) + "\n")
    return source, tmp_path / "repos", gold


def test_instances_become_tasks_graded_as_swebench_grades(instance) -> None:
    source, repos, gold = instance
    (task,) = load_source(source, repos=repos)
    assert task.id == "acme__calc-1" and task.instruction.startswith("add() subtracts")
    assert task.grade_from == "patch" and task.metadata["repo"] == "acme/calc"
    ws = task.workspace
    assert _git(ws, "rev-list", "--all").split() == [_git(ws, "rev-parse", "HEAD").strip()]  # one commit
    assert subprocess.run(["git", "-C", str(ws), "cat-file", "-e", gold], capture_output=True).returncode != 0
    assert (
        "a - b" in (ws / "calc.py").read_text()
        and "test_add" not in (ws / "tests" / "test_calc.py").read_text()
    )

    agents = {
        "fix": "sed -i 's/return a - b/return a + b/' calc.py",  # fixes add (and, as written, sub too: P2P fails)
        "fix-add": "python3 -c \"import re,pathlib;p=pathlib.Path('calc.py');p.write_text(p.read_text().replace('return a - b','return a + b',1))\"",
        "nothing": "true",
        "cheat": "printf 'def test_add():\\n    pass\\n' >> tests/test_calc.py && "
        "printf 'import pytest\\n@pytest.hookimpl(tryfirst=True)\\ndef pytest_runtest_call(item):\\n    pass\\n' > conftest.py",
    }
    rewards, results = {}, {}
    for name, command in agents.items():
        episodes = Episodes()
        jobs = Rollout(Plan([task], 1, 1), _settings(episodes, command)).run()
        rewards[name] = (jobs[0].reward, jobs[0].reward_note)
        (results[name],) = episodes.rewards[jobs[0].episode.episode_id]
    assert rewards["fix-add"][0] == 1.0, rewards["fix-add"]
    assert rewards["fix"][0] == 0.0  # test_sub (PASS_TO_PASS) broke
    assert rewards["nothing"][0] == 0.0
    assert rewards["cheat"][0] == 0.0 and "1 steers-tests (conftest.py)" in rewards["cheat"][1], rewards[
        "cheat"
    ]
    # with each reward: the agent's changes as a diff, and the grader's per-test results
    fixed = results["fix-add"]
    assert fixed.grading == {
        "resolved": True,
        "parser": "pytest -rA",
        "tests": {"tests/test_calc.py::test_add": "PASSED", "tests/test_calc.py::test_sub": "PASSED"},
    }
    assert fixed.patch.startswith("diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n")
    assert "-    return a - b\n+    return a + b\n" in fixed.patch
    assert results["fix"].grading["tests"]["tests/test_calc.py::test_sub"] == "FAILED"
    assert results["nothing"].patch == "" and results["nothing"].grading["resolved"] is False
    cheat = results["cheat"]  # the test edit is graded (and reset by the grader); conftest.py left out
    assert "diff --git a/tests/test_calc.py" in cheat.patch and "conftest.py" not in cheat.patch


def test_a_bad_source_is_an_error_naming_the_row_and_runs_nothing(instance, tmp_path: Path) -> None:
    source, repos, _gold = instance
    row = json.loads(source.read_text())
    with pytest.raises(TaskError, match="--repos DIR"):
        load_source(source)
    for broken, message in [
        ({**row, "FAIL_TO_PASS": "not json"}, "field 'FAIL_TO_PASS' is not a list"),
        ({k: v for k, v in row.items() if k != "test_patch"}, "field(s) test_patch missing"),
        ({**row, "repo": "acme/other"}, "no clone of acme/other"),
        ({**row, "base_commit": "0" * 40}, f"base_commit {'0' * 40} is not in"),
    ]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(json.dumps(broken) + "\n")
        with pytest.raises(TaskError) as e:
            load_source(bad, repos=repos)
        assert f"{bad}:1" in e.value.message and message in e.value.message, e.value.message


def test_the_official_log_parser_reads_a_repository_swebench_knows_and_pytests_lines_the_others(
    instance, tmp_path: Path
) -> None:
    """The same instance as psf/requests (SWE-bench's parser: parse_log_pytest_options), as django/django
    (SWE-bench runs it with its own runner, not pytest: pytest's lines are read), and as acme/calc (unknown)."""
    if os.environ.get("CI"):  # the test extra installs it: in CI its absence fails the test
        import swebench
    else:
        swebench = pytest.importorskip("swebench", reason="the swebench extra (pip install '.[swebench]')")
    source, repos, _gold = instance
    row = json.loads(source.read_text())
    fix = "python3 -c \"import pathlib;p=pathlib.Path('calc.py');p.write_text(p.read_text().replace('return a - b','return a + b',1))\""
    parsers = {}
    for repo in ("psf/requests", "django/django", "acme/calc"):
        owner_name = repo.replace("/", "__")
        if not (repos / owner_name).exists():
            (repos / owner_name).symlink_to(repos / "acme__calc")
        as_repo = tmp_path / f"{owner_name}.jsonl"
        as_repo.write_text(json.dumps({**row, "repo": repo, "instance_id": f"{owner_name}-1"}) + "\n")
        (task,) = load_source(as_repo, repos=repos)
        episodes = Episodes()
        jobs = Rollout(Plan([task], 1, 1), _settings(episodes, fix)).run()
        (result,) = episodes.rewards[jobs[0].episode.episode_id]
        assert jobs[0].reward == 1.0 and result.grading["resolved"] is True, jobs[0].reward_note
        parsers[repo] = result.grading["parser"]
    assert parsers == {
        "psf/requests": f"swebench {swebench.__version__} parse_log_pytest_options",
        "django/django": "pytest -rA",
        "acme/calc": "pytest -rA",
    }
