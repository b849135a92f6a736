"""The drift audit over an episode of the real Qwen Code CLI (npm), recorded through the real proxy on a
scripted backend. Qwen Code runs the scripted `ls` and sends the assistant turn back with the tool
arguments re-serialized (`{"command": "ls"}` sampled, `{"command":"ls"}` sent back): the recorded
prompt still extends what the model sampled (T2), while a fresh render drifts inside the tool call."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from audit_processes import audit, check_episode, record, scripted_backend

from polarproxy.render.renderer import Renderer
from polarproxy.store.store import Store

QWEN = Path(__file__).resolve().parents[2] / ".cache" / "harnesses" / "node_modules" / ".bin" / "qwen"
# as tests/harnesses: skipped where the CLI is not installed, except in CI (`make test` installs it)
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not QWEN.exists() and not os.environ.get("CI"),
        reason="Qwen Code CLI not installed: `make harnesses` installs it (make test does this first)",
    ),
]
SCRIPT = {
    "steps": [
        {
            "reasoning": "I will list the files.",
            "tool_calls": [{"name": "run_shell_command", "arguments": {"command": "ls"}}],
        }
    ],
    "final": "The folder holds README.md and hello.py. Done.",
    "side_answer": "Listing files",
}


def test_qwen_code_re_serialized_arguments_drift_and_the_audit_says_where(tiny_model_dir, tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("# hello\n")
    (ws / "hello.py").write_text("print('hello')\n")
    db = tmp_path / "qwen.db"
    prompt = "List the files, then say done."
    with scripted_backend(tiny_model_dir, SCRIPT, tmp_path) as url:
        eid, proc = record(
            url, tiny_model_dir, db, ws, [str(QWEN), "-p", prompt, "--yolo"], "--harness", "qwen"
        )
    assert SCRIPT["final"] in proc.stdout
    r = audit(db, "--json")
    assert r.returncode == 0, r.stderr
    (ep,) = json.loads(r.stdout)["episodes"]
    calls = Store.open(str(db)).list_calls(eid)
    drifted = check_episode(ep, calls, Renderer(tiny_model_dir))
    main = [c for c in calls if c.has_tools]
    first, second = main[0], main[1]
    assert second.render_mode == "extended" and second.extended_from == first.id
    row = next(x for x in ep["per_call"] if x["call_id"] == second.id)
    assert drifted >= 1 and row["result"] == "drifted" and row["prefix_exact"] is True
    # the drift is inside the tool call the model sampled: its arguments came back re-serialized
    start = len(first.prompt_ids)
    assert start < row["first_diff"] < start + len(first.output_ids)
    sampled = first.completion["tool_calls"][0]["arguments"]
    (sent,) = [m for m in second.conversation["messages"] if m["role"] == "assistant"][-1]["tool_calls"]
    assert sent["arguments"] != sampled and json.loads(sent["arguments"]) == json.loads(sampled)
