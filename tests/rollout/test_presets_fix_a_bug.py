"""Each built-in preset's headless command (Aider's aside: it has no tools), under `rollout` in the bwrap
sandbox (as root in CI: the episode's own user), does a coding task: a scripted policy calls the harness's
own shell tool to edit a file and then to run the tests, and the episode is graded as SWE-bench grades
(examples/swe/'s calc instance: resolved only when the fix landed). The CLIs come from `make harnesses`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from rollout_support import REPO, bwrap_or_skip, run_rollout, tools_path

from polarproxy.store.store import Store

sys.path.insert(0, str(REPO / "examples" / "swe"))
import suite  # examples/swe/suite.py

BIN = REPO / ".cache" / "harnesses" / "node_modules" / ".bin"
# each preset's shell tool and its command argument (docs/usage.md's table), and its CLI
SHELL = {
    "claude": ("Bash", "command", "claude"),
    "codex": ("exec_command", "cmd", "codex"),
    "qwen": ("run_shell_command", "command", "qwen"),
    "gemini": ("run_shell_command", "command", "gemini"),
    "opencode": ("bash", "command", "opencode"),
    "pi": ("bash", "command", "pi"),
}

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def calc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/swe/'s calc instance alone: its instances file (repositories beside it)."""
    out = tmp_path_factory.mktemp("swe-calc")
    source = suite.build(out)
    rows = [
        line for line in source.read_text().splitlines() if json.loads(line)["instance_id"] == "acme__calc-1"
    ]
    source.write_text(rows[0] + "\n")
    return source


def test_each_preset_edits_the_workspace_and_runs_the_tests_under_rollout(
    calc: Path, make_backend, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """One rollout, every preset (`--harness` repeated: one group per harness), one policy whose cases pick
    each harness's own shell tool by its name."""
    missing = [cli for _tool, _arg, cli in SHELL.values() if not (BIN / cli).exists()]
    if missing and not os.environ.get("CI"):
        pytest.skip(f"{missing} not installed: `make harnesses` installs them (make test does this first)")
    bwrap_or_skip()
    cases = []
    for tool, arg, _cli in sorted(set(SHELL.values())):  # one case per tool, in a fixed order
        cases.append(
            {
                "when": {"tool": tool},
                "steps": [
                    {"tool_calls": [{"name": tool, "arguments": {arg: "sed -i '2s/a - b/a + b/' calc.py"}}]},
                    {"tool_calls": [{"name": tool, "arguments": {arg: "python3 -m pytest -q tests"}}]},
                ],
            }
        )
    script = {
        "steps": ["I have no shell."],
        "cases": cases,
        "final": "Fixed add().",
        "side_answer": "Fixing add",
    }
    (tmp_path / "policy.json").write_text(json.dumps(script))
    backend = make_backend(tiny_model_dir, "--script", str(tmp_path / "policy.json"))
    db = tmp_path / "r.db"
    harnesses = [a for h in SHELL for a in ("--harness", h)]
    proc = run_rollout(
        *(str(calc), "--repos", str(calc.parent / "repos"), *harnesses, "--backend", backend.url),
        *("--model", str(tiny_model_dir), "--db", str(db), "--concurrency", "2", "--json"),
        timeout=600,
        env={**tools_path(BIN), "NO_COLOR": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    with Store.open(str(db)) as store:
        episodes = {e.harness: e for e in store.list_episodes(limit=None)}
        assert sorted(episodes) == sorted(SHELL)
        for harness, episode in episodes.items():
            reward = store.list_rewards(episode.id)[-1]
            told = (harness, reward.origin.note, reward.origin.output_tail)
            assert episode.reward == 1.0 and reward.origin.grading["resolved"] is True, told
            assert "+    return a + b" in reward.origin.patch, told
            ran = json.dumps([c.conversation for c in store.list_calls(episode.id)])
            assert "passed" in ran, (
                f"{harness} did not run the tests (or its tool output is not in the record)"
            )
