"""The real Claude Code CLI, unmodified, talking to "api.anthropic.com" (a stand-in) through intercept mode."""

from __future__ import annotations

import json
import os

import pytest
from intercept_run import HERE, run_intercept
from standin import StandIn

BIN = HERE.parent.parent / ".cache" / "harnesses" / "node_modules" / ".bin"

pytestmark = pytest.mark.integration


@pytest.fixture
def claude() -> str:
    path = BIN / "claude"
    if not path.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing: run `make harnesses`")
        pytest.skip("Claude Code CLI is not installed (make harnesses)")
    return str(path)


def test_claude_code_in_intercept_mode_exits_0_with_its_calls_recorded(tmp_path, test_ca, claude):
    standin = StandIn(test_ca, text_only=True)
    try:
        env = {
            "ANTHROPIC_API_KEY": "sk-ant-test-key-never-stored",
            "CLAUDE_CONFIG_DIR": str(tmp_path / ".claude"),
            "HOME": str(tmp_path),
            "IS_SANDBOX": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
        }
        for name in ("ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_MODEL"):
            env[name] = ""
        rec = run_intercept(tmp_path, standin, test_ca, [claude, "-p", "Say done."], env=env, timeout=300)
    finally:
        standin.stop()
    assert "Done." in rec.proc.stdout
    main = [c for c in rec.calls if c.dialect == "anthropic" and c.method == "POST" and c.conversation]
    assert main, [(c.path, c.status, c.error) for c in rec.calls]
    assert all(c.status == "ok" and c.fidelity == "text" for c in main), [(c.path, c.error) for c in main]
    streamed = [c for c in main if c.stream]
    assert streamed and streamed[0].completion["text"] == "Done." and streamed[0].ttft_ms is not None
    body = json.loads(streamed[0].request_body)
    assert body["messages"][0]["role"] == "user" and body["stream"] is True
    assert streamed[0].request_headers.get("x-api-key") == "<redacted>"
    for f in tmp_path.glob("intercept.db*"):
        assert b"sk-ant-test-key-never-stored" not in f.read_bytes()
