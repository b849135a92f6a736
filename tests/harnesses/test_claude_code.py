"""The real Claude Code CLI (npm @anthropic-ai/claude-code), unmodified, recorded through `--harness claude`."""

from __future__ import annotations

import json

import pytest
from recording import (
    BIN,
    check_calls,
    check_side_requests,
    check_tool_loops,
    needs_cli,
    reasoning_for,
    scripted_backend,
)

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
    """Two Bash commands, then the final answer: each later call extends the one before (T2). No title
    side request was seen from Claude Code 2.1.332 in `-p` mode, even with nonessential traffic allowed
    (the 2.1.197 capture in ../shared has one); any side request it makes must be marked as one."""
    url = scripted_backend(
        make_backend,
        tiny_model_dir,
        tmp_path,
        "Bash",
        {"command": "ls", "description": "List"},
        ("Bash", {"command": "cat README.md", "description": "Read"}),
    )
    rec = record_harness(
        "claude",
        [
            str(BIN / "claude"),
            "-p",
            "List the files, read README.md, then say done.",
            "--dangerously-skip-permissions",
        ],
        backend_url=url,  # no IS_SANDBOX here: the preset sets it, so this works as root too
    )
    check_calls(rec, tiny_model_dir, dialect="anthropic", auth_header="x-api-key")
    main = check_tool_loops(rec, ["Bash", "Bash"], ["hello.py", "# hello"])
    check_side_requests(rec)
    sent_back = json.loads(main[-1].request_body)["messages"]
    turns = [m for m in sent_back if m["role"] == "assistant"]
    assert len(turns) == 2
    for i, turn in enumerate(turns):
        thinking = next(b for b in turn["content"] if b["type"] == "thinking")  # ours, returned
        assert thinking["thinking"] == reasoning_for(i) and thinking["signature"]
        assert any(b["type"] == "tool_use" and b["name"] == "Bash" for b in turn["content"])
