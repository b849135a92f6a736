"""The real Qwen Code CLI runs a real tool loop against a scripted backend: it asks to run `ls`, Qwen Code
runs it, sends the result back, and the script answers. Every token in the record is still exact."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from recording import needs_cli

from polarproxy.render.renderer import Renderer
from polarproxy.store.store import Store

REPO = Path(__file__).resolve().parents[2]
QWEN = REPO / ".cache" / "harnesses" / "node_modules" / ".bin" / "qwen"
pytestmark = [pytest.mark.integration, needs_cli("qwen", "Qwen Code CLI")]
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


def test_qwen_code_tool_loop_on_a_scripted_backend(make_backend, tiny_model_dir, tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps(SCRIPT))
    backend = make_backend(tiny_model_dir, "--script", str(script))
    home = tmp_path / "home"
    (home / ".qwen").mkdir(parents=True)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("# hello\n")
    (ws / "hello.py").write_text("print('hello')\n")
    db = tmp_path / "q.db"
    env = {**os.environ, "HOME": str(home), "OPENAI_MODEL": "tiny", "NO_COLOR": "1"}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "polarproxy",
            "record",
            "--backend",
            backend.url,
            "--model",
            str(tiny_model_dir),
            "--db",
            str(db),
            "--harness",
            "qwen",
            "--json",
            "--",
            str(QWEN),
            "-p",
            "List the files in the current directory, then say done.",
            "--yolo",
        ],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    assert "The folder holds README.md and hello.py. Done." in r.stdout
    summary = json.loads(r.stdout[r.stdout.rindex('{\n  "episode_id"') :])
    calls = Store.open(str(db)).list_calls(summary["episode_id"])
    main = [c for c in calls if c.conversation and c.conversation["tools"]]
    assert len(main) >= 2, [c.completion for c in calls]
    assert all(c.status == "ok" for c in calls)
    first, second = main[0], main[1]
    assert first.completion["tool_calls"][0]["name"] == "run_shell_command"
    assert first.completion["reasoning"] == "I will list the files."
    tool_msgs = [m for m in second.conversation["messages"] if m["role"] == "tool"]
    assert tool_msgs and "hello.py" in tool_msgs[-1]["content"]  # Qwen Code really ran `ls`
    assert second.completion["text"] == SCRIPT["final"]
    # T2: the second turn extends the first although Qwen Code re-serialized the tool arguments
    assert second.render_mode == "extended" and second.extended_from == first.id, second.render_note
    n = len(first.prompt_ids) + len(first.output_ids)
    assert second.prompt_ids[:n] == first.prompt_ids + first.output_ids
    renderer = Renderer(tiny_model_dir)
    for c in main:  # the recorded output is exactly the script's tokens, stop token included
        assert renderer.decode(c.output_ids[:-1]) in (
            "<think>\nI will list the files.\n</think>\n\n"
            '<tool_call>\n{"name": "run_shell_command", "arguments": '
            '{"command": "ls"}}\n</tool_call>',
            SCRIPT["final"],
        )
        assert len(c.output_logprobs) == len(c.output_ids)
