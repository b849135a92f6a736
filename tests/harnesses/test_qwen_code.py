"""The real Qwen Code CLI (npm @qwen-code/qwen-code), unmodified, recorded through `--harness qwen`."""

from __future__ import annotations

import json

import pytest
from recording import BIN, check_calls, needs_cli

pytestmark = [pytest.mark.integration, needs_cli("qwen", "Qwen Code CLI")]


def test_qwen_code_exits_0_with_its_calls_recorded(record_harness, tiny_model_dir):
    rec = record_harness(
        "qwen",
        [str(BIN / "qwen"), "-p", "List the files in the current directory, then say done.", "--yolo"],
        "--model-name",
        "tiny",
    )
    check_calls(rec, tiny_model_dir, dialect="openai_chat", auth_header="authorization")
    assert all(c.stream and c.path == "/v1/chat/completions" for c in rec.calls)
    body = json.loads(rec.calls[0].request_body)
    assert body["model"] == "tiny"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert "Qwen Code" in body["messages"][0]["content"]  # the harness's own system prompt, untouched
