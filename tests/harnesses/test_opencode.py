"""The real OpenCode CLI (npm opencode-ai), unmodified, recorded through `--harness opencode` (Chat
Completions through its `@ai-sdk/openai-compatible` provider, which it installs from npm on first run)."""

from __future__ import annotations

import json

import pytest
from recording import (
    BIN,
    SIDE_ANSWER,
    check_calls,
    check_side_requests,
    check_tool_loops,
    needs_cli,
    scripted_backend,
)

pytestmark = [pytest.mark.integration, needs_cli("opencode", "OpenCode CLI")]


def test_opencode_tool_loop_on_a_scripted_backend(record_harness, make_backend, tiny_model_dir, tmp_path):
    """Two bash commands, then the final answer: each later main call extends the one before (T2); the
    title request is a side request of the same episode that offers no tools."""
    url = scripted_backend(
        make_backend,
        tiny_model_dir,
        tmp_path,
        "bash",
        {"command": "ls"},
        ("bash", {"command": "cat README.md"}),
    )
    rec = record_harness(
        "opencode",
        [str(BIN / "opencode"), "run", "--auto", "List the files, read README.md, then say done."],
        "--model-name",
        "tiny",
        backend_url=url,
    )
    check_calls(rec, tiny_model_dir, dialect="openai_chat", auth_header="authorization")
    assert all(c.path == "/v1/chat/completions" and c.stream for c in rec.calls), [c.path for c in rec.calls]
    main = check_tool_loops(rec, ["bash", "bash"], ["hello.py", "# hello"])
    body = json.loads(main[0].request_body)
    assert body["model"] == "tiny" and body["stream"] is True
    assert "opencode" in body["messages"][0]["content"].lower()  # the harness's own system prompt
    (title,) = check_side_requests(rec, at_least=1)  # the session title, from `small_model`
    assert "title" in json.loads(title.request_body)["messages"][0]["content"].lower()
    assert title.completion["text"] == SIDE_ANSWER
