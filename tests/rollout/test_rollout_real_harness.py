"""`polarproxy rollout --harness qwen`: the real Qwen Code CLI as the agent of each episode, run by the
preset's headless command with the task's instruction, against a scripted backend on the tiny model. It
runs a shell tool call that writes answer.txt in the episode's workspace copy; the task's hidden-test
verifier scores it (greet passes, shout does not), and each episode's calls extend one another (T2)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rollout_support import EXAMPLE, bwrap_or_skip, rollout_argv

from polarproxy.store.store import Store

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".cache" / "harnesses" / "node_modules" / ".bin"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not (BIN / "qwen").exists() and not os.environ.get("CI"),
        reason="Qwen Code CLI not installed: `make harnesses` installs it (make test does this first)",
    ),
]
SCRIPT = {
    "steps": [
        {
            "reasoning": "I will write the greeting.",
            "tool_calls": [
                {"name": "run_shell_command", "arguments": {"command": "echo 'Hello there.' > answer.txt"}}
            ],
        }
    ],
    "final": "Done: answer.txt holds the greeting.",
    "side_answer": "Greeting",
}


def _rollout_example_tasks(
    harness: str, script: dict, isolation: str, make_backend, tiny_model_dir: Path, tmp_path: Path
) -> tuple[dict, Path]:
    """`rollout` of the example tasks (greet, shout) with the real CLI of `harness` against a backend that
    follows `script`; the summary and the store, once both episodes are done and scored as expected (the
    CLI ran the tool: greet's answer.txt says Hello, shout's is not in capitals)."""
    import subprocess

    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    url = make_backend(tiny_model_dir, "--script", str(path)).url
    db = tmp_path / "r.db"
    argv = rollout_argv(
        str(EXAMPLE / "tasks.jsonl"),
        *("--harness", harness, "--samples", "1", "--concurrency", "2"),
        *("--backend", url, "--model", str(tiny_model_dir), "--db", str(db)),
        *("--isolation", isolation, "--json"),
    )
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "NO_COLOR": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["states"] == {"done": 2}, summary
    assert summary["tasks"]["greet"]["rewards"] == [1.0], summary["episodes"]
    assert summary["tasks"]["shout"]["rewards"] == [0.0]
    return summary, db


@pytest.mark.parametrize("isolation", ["none", "bwrap"])
def test_rollout_runs_the_real_qwen_code_cli_per_episode_and_scores_its_work(
    make_backend, tiny_model_dir: Path, tmp_path: Path, isolation: str
) -> None:
    """Under bwrap (as root in CI: the episode's own host user, the allow-listed file system) the node CLI
    still finds its install and runs its tools."""
    if isolation == "bwrap":
        bwrap_or_skip()
    summary, db = _rollout_example_tasks("qwen", SCRIPT, isolation, make_backend, tiny_model_dir, tmp_path)
    store = Store.open(str(db))
    try:
        eps = [
            e
            for e in store.list_episodes(limit=None)
            if e.task and e.metadata.get("rollout_id") == summary["rollout_id"]
        ]
        assert len(eps) == 2
        for e in eps:
            assert e.harness == "qwen" and e.status == "ok", (e.harness, e.status)
            main = [c for c in store.list_calls(e.id) if c.has_tools]
            assert len(main) >= 2 and main[0].completion["tool_calls"][0]["name"] == "run_shell_command"
            assert [c.render_mode for c in main[1:]] == ["extended"] * (len(main) - 1), [
                (c.render_mode, c.render_note) for c in main
            ]
            assert "answer.txt" in json.dumps(main[1].conversation)  # the tool's run reached the next call
    finally:
        store.close()


CODEX_SCRIPT = {
    "steps": [
        {
            "reasoning": "I will write the greeting.",
            "tool_calls": [
                {
                    "name": "exec_command",
                    "arguments": {"cmd": "echo 'Hello there.' > answer.txt; echo PATH=$PATH"},
                }
            ],
        }
    ],
    "final": "Done: answer.txt holds the greeting.",
    "side_answer": "Greeting",
}


@pytest.mark.skipif(
    not (BIN / "codex").exists() and not os.environ.get("CI"), reason="Codex CLI not installed"
)
def test_rollout_runs_the_real_codex_cli_whose_own_sandbox_edits_the_workspace_inside_ours(
    make_backend, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The Codex preset as shipped, under rollout's bwrap (as root in CI): Codex runs its shell tool in its
    own sandbox, nested in ours, in workspace-write mode, so its edit lands and the verifier scores it (as
    shipped before, its read-only sandbox failed every edit and each episode ended with reward 0). Its tools
    keep the PATH the harness was given (no login shell rebuilding it: the task's python3 and pytest)."""
    bwrap_or_skip()
    _summary, db = _rollout_example_tasks(
        "codex", CODEX_SCRIPT, "bwrap", make_backend, tiny_model_dir, tmp_path
    )
    store = Store.open(str(db))
    try:
        for e in store.list_episodes(limit=None):
            last = store.list_calls(e.id)[-1]
            outputs = [
                str(m.get("content")) for m in last.conversation["messages"] if m.get("role") == "tool"
            ]
            assert any("PATH=" in o and str(BIN) in o for o in outputs), outputs
    finally:
        store.close()
