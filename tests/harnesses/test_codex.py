"""The real Codex CLI (npm @openai/codex), unmodified, recorded through `--harness codex` (Responses API)."""

from __future__ import annotations

import json

import pytest
from recording import BIN, check_calls, check_side_requests, check_tool_loops, needs_cli, scripted_backend

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
    """Two shell commands, then the final answer: each later call extends the one before (T2)."""
    url = scripted_backend(
        make_backend,
        tiny_model_dir,
        tmp_path,
        "exec_command",
        {"cmd": "ls"},
        ("exec_command", {"cmd": "cat README.md"}),
    )
    rec = record_harness(
        "codex",
        [
            str(BIN / "codex"),
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "List the files, read README.md, then say done.",
        ],
        backend_url=url,
    )
    check_calls(rec, tiny_model_dir, dialect="openai_responses", auth_header="authorization")
    main = check_tool_loops(rec, ["exec_command", "exec_command"], ["hello.py", "# hello"])
    check_side_requests(rec)  # Codex sends none in exec mode; any it sends must be marked so
    items = json.loads(main[-1].request_body)["input"]
    kinds = [i.get("type") for i in items]
    assert kinds.count("reasoning") == 2 and kinds.count("function_call") == 2
    assert kinds.count("function_call_output") == 2
    reasoning = next(i for i in items if i.get("type") == "reasoning")
    assert reasoning.get("encrypted_content")  # what we returned, sent back verbatim


def test_codex_runs_its_tools_in_its_own_sandbox_with_the_usual_command(
    record_harness, make_backend, tiny_model_dir, tmp_path
):
    """`codex exec --skip-git-repo-check "P"`, without --dangerously-bypass-approvals-and-sandbox: Codex's
    own bubblewrap sandbox must work under the preset (its helper binaries live in CODEX_HOME, which Codex
    refuses to use under the temporary folder), and the command's output must reach the next request."""
    url = scripted_backend(make_backend, tiny_model_dir, tmp_path, "exec_command", {"cmd": "ls"})
    rec = record_harness(
        "codex",
        [str(BIN / "codex"), "exec", "--skip-git-repo-check", "List the files, then say done."],
        backend_url=url,
    )
    assert rec.proc.returncode == 0, rec.tails()
    main = check_tool_loops(rec, ["exec_command"], ["hello.py"])
    sent_back = [m for m in main[1].conversation["messages"] if m["role"] == "tool"]
    assert "codex-linux-sandbox" not in sent_back[-1]["content"] and "bwrap" not in sent_back[-1]["content"]
