"""The real Codex CLI (npm @openai/codex), unmodified, recorded through `--harness codex` (Responses API)."""

from __future__ import annotations

import json

import pytest
from recording import BIN, check_calls, check_tool_loop, needs_cli, scripted_backend

pytestmark = [pytest.mark.integration, needs_cli("codex", "Codex CLI")]


def test_codex_exits_0_with_its_calls_recorded(record_harness, tiny_model_dir):
    rec = record_harness(
        "codex",
        [
            str(BIN / "codex"),
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "List the files in the current directory, then say done.",
        ],
    )
    check_calls(rec, tiny_model_dir, dialect="openai_responses", auth_header="authorization")
    call = rec.calls[0]
    assert call.path == "/v1/responses" and call.stream
    body = json.loads(call.request_body)
    assert body["model"] == tiny_model_dir.name  # --model-name defaults to the model folder's name
    assert body["stream"] is True and "instructions" not in body
    assert body["input"][0]["role"] == "developer"  # the harness's own system prompt, as it sends it
    assert "Codex" in json.dumps(body["input"][0])


def test_codex_tool_loop_on_a_scripted_backend(record_harness, make_backend, tiny_model_dir, tmp_path):
    url = scripted_backend(make_backend, tiny_model_dir, tmp_path, "exec_command", {"cmd": "ls"})
    rec = record_harness(
        "codex",
        [
            str(BIN / "codex"),
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "List the files, then say done.",
        ],
        backend_url=url,
    )
    check_calls(rec, tiny_model_dir, dialect="openai_responses", auth_header="authorization")
    _, second = check_tool_loop(rec, "exec_command")
    items = json.loads(second.request_body)["input"]
    kinds = [i.get("type") for i in items]
    assert "reasoning" in kinds and "function_call" in kinds and "function_call_output" in kinds
    reasoning = next(i for i in items if i.get("type") == "reasoning")
    assert reasoning.get("encrypted_content")  # what we returned, sent back verbatim
