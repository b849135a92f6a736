"""The real Qwen Code CLI (npm @qwen-code/qwen-code), unmodified, recorded through polarproxy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from polarproxy.conversation import Conversation
from polarproxy.render.renderer import Renderer
from polarproxy.store.store import Store

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
QWEN = REPO / ".cache" / "harnesses" / "node_modules" / ".bin" / "qwen"
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not QWEN.exists(),
        reason="Qwen Code CLI not installed: `make harnesses` installs it (make test does this first)",
    ),
]


def test_qwen_code_exits_0_with_its_calls_recorded(backend, tiny_model_dir, tmp_path):
    home = tmp_path / "home"
    (home / ".qwen").mkdir(parents=True)
    settings = SHARED / "harnesses" / "qwen-settings-no-telemetry.json"
    if settings.is_file():
        shutil.copy(settings, home / ".qwen" / "settings.json")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("# hello\n")
    (ws / "hello.py").write_text("print('hello')\n")
    db = tmp_path / "qwen.db"
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
    summary = json.loads(r.stdout[r.stdout.rindex('{\n  "episode_id"') :])
    store = Store.open(str(db))
    calls = store.list_calls(summary["episode_id"])
    assert calls, "Qwen Code made no model call through the proxy"
    renderer = Renderer(tiny_model_dir)
    for call in calls:
        assert call.status == "ok", (call.status, call.error)
        assert call.dialect == "openai_chat" and call.stream
        assert call.request_headers.get("authorization") == "<redacted>"
        assert len(call.output_ids) == len(call.output_logprobs) > 0
        assert call.prompt_ids == renderer.render(Conversation.from_dict(call.conversation)).ids
    body = json.loads(calls[0].request_body)
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "Qwen Code" in body["messages"][0]["content"]  # the harness's own system prompt, untouched
    for f in tmp_path.glob("qwen.db*"):
        assert b"sk-polarproxy-local" not in f.read_bytes()
