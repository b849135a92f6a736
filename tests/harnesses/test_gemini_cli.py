"""The real Gemini CLI (npm @google/gemini-cli), unmodified, recorded through `--harness gemini`."""

from __future__ import annotations

import json

import pytest
from recording import BIN, check_calls, check_tool_loop, needs_cli, scripted_backend

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
    url = scripted_backend(make_backend, tiny_model_dir, tmp_path, "run_shell_command", {"command": "ls"})
    rec = record_harness(
        "gemini",
        [str(BIN / "gemini"), "-p", "List the files, then say done.", "--yolo", "--skip-trust"],
        "--model-name",
        "tiny",
        backend_url=url,
    )
    check_calls(rec, tiny_model_dir, dialect="gemini", auth_header="x-goog-api-key")
    _, second = check_tool_loop(rec, "run_shell_command")
    contents = json.loads(second.request_body)["contents"]
    call_parts = [p for c in contents if c["role"] == "model" for p in c["parts"] if "functionCall" in p]
    assert call_parts and call_parts[0]["functionCall"]["name"] == "run_shell_command"
    assert call_parts[0].get("thoughtSignature")  # kept by the harness, so the turn is recognised (T2)
    assert any("functionResponse" in p for c in contents for p in c["parts"])
