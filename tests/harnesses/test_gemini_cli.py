"""The real Gemini CLI (npm @google/gemini-cli), unmodified, recorded through `--harness gemini`."""

from __future__ import annotations

import json

import pytest
from recording import BIN, check_calls, check_side_requests, check_tool_loops, needs_cli, scripted_backend

pytestmark = [pytest.mark.integration, needs_cli("gemini", "Gemini CLI")]


def test_gemini_cli_exits_0_with_its_calls_recorded(record_harness, tiny_model_dir):
    rec = record_harness(
        "gemini",
        [
            str(BIN / "gemini"),
            "-p",
            "List the files in the current directory, then say done.",
            "--yolo",
            "--skip-trust",
        ],
        "--model-name",
        "tiny",
    )
    check_calls(rec, tiny_model_dir, dialect="gemini", auth_header="x-goog-api-key")
    streamed = [c for c in rec.calls if ":streamGenerateContent" in c.path]
    assert streamed, [c.path for c in rec.calls]
    call = streamed[0]
    assert call.path.startswith("/v1beta/models/tiny:streamGenerateContent") and call.stream
    body = json.loads(call.request_body)
    assert "model" not in body and body["contents"][0]["role"] == "user"
    assert "Gemini CLI" in body["systemInstruction"]["parts"][0]["text"]  # the harness's own system prompt


def test_gemini_cli_tool_loop_on_a_scripted_backend(record_harness, make_backend, tiny_model_dir, tmp_path):
    """Two shell commands, then the final answer: each later main call extends the one before (T2). With
    the model left to Gemini CLI's router (`auto`), the complexity-router call before the prompt is a side
    request of the same episode that offers no tools (it expects JSON; our plain answer makes the CLI fall
    back to its default model)."""
    url = scripted_backend(
        make_backend,
        tiny_model_dir,
        tmp_path,
        "run_shell_command",
        {"command": "ls"},
        ("run_shell_command", {"command": "cat README.md"}),
    )
    rec = record_harness(
        "gemini",
        [
            str(BIN / "gemini"),
            "-p",
            "List the files, read README.md, then say done.",
            "--yolo",
            "--skip-trust",
        ],
        "--model-name",
        "auto",
        backend_url=url,
    )
    check_calls(rec, tiny_model_dir, dialect="gemini", auth_header="x-goog-api-key")
    main = check_tool_loops(rec, ["run_shell_command", "run_shell_command"], ["hello.py", "# hello"])
    assert all(":streamGenerateContent" in c.path for c in main)
    side = check_side_requests(rec, at_least=1)  # the router
    assert all(":generateContent" in c.path and not c.stream for c in side), [c.path for c in side]
    router = json.loads(side[0].request_body)
    assert router["generationConfig"]["responseMimeType"] == "application/json" and "tools" not in router
    contents = json.loads(main[-1].request_body)["contents"]
    call_parts = [p for c in contents if c["role"] == "model" for p in c["parts"] if "functionCall" in p]
    assert [p["functionCall"]["name"] for p in call_parts] == ["run_shell_command"] * 2
    assert all(p.get("thoughtSignature") for p in call_parts)  # kept by the harness: turns recognised (T2)
    assert sum("functionResponse" in p for c in contents for p in c["parts"]) == 2
