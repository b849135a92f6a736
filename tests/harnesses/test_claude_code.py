"""The real Claude Code CLI (npm @anthropic-ai/claude-code), unmodified, recorded through `--harness claude`."""

from __future__ import annotations

import json

import pytest
from recording import BIN, check_calls, check_tool_loop, needs_cli, scripted_backend

pytestmark = [pytest.mark.integration, needs_cli("claude", "Claude Code CLI")]


def test_claude_code_exits_0_with_its_calls_recorded(record_harness, tiny_model_dir):
    rec = record_harness(
        "claude",
        [str(BIN / "claude"), "-p", "List the files in the current directory, then say done."],
        "--model-name",
        "tiny",
        env={
            "IS_SANDBOX": "1"
        },  # tests may run as root; this is what --dangerously-skip-permissions would need
    )
    check_calls(rec, tiny_model_dir, dialect="anthropic", auth_header="x-api-key")
    main = [c for c in rec.calls if c.conversation and c.conversation["tools"]]
    assert main, [c.path for c in rec.calls]
    call = main[0]
    assert call.path.startswith("/v1/messages") and call.stream
    body = json.loads(call.request_body)
    assert body["model"] == "tiny" and body["stream"] is True
    assert (
        "x-anthropic-billing-header" in body["system"][0]["text"]
    )  # the harness's own system blocks, untouched
    assert rec.episode.metadata["model_name"] == "tiny"


def test_claude_code_tool_loop_on_a_scripted_backend(record_harness, make_backend, tiny_model_dir, tmp_path):
    url = scripted_backend(
        make_backend, tiny_model_dir, tmp_path, "Bash", {"command": "ls", "description": "List"}
    )
    rec = record_harness(
        "claude",
        [str(BIN / "claude"), "-p", "List the files, then say done.", "--dangerously-skip-permissions"],
        env={"IS_SANDBOX": "1"},
        backend_url=url,
    )
    check_calls(rec, tiny_model_dir, dialect="anthropic", auth_header="x-api-key")
    _, second = check_tool_loop(rec, "Bash")
    sent_back = json.loads(second.request_body)["messages"]
    turn = next(m for m in sent_back if m["role"] == "assistant")
    thinking = next(b for b in turn["content"] if b["type"] == "thinking")  # our thinking block, returned
    assert thinking["thinking"] == "I will list the files." and thinking["signature"]
    assert any(b["type"] == "tool_use" and b["name"] == "Bash" for b in turn["content"])
