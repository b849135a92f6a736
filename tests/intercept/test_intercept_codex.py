"""The real Codex CLI, unmodified, talking to "api.openai.com" (a stand-in) through intercept mode."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from intercept_run import HERE, run_intercept
from ws_standin import WsStandIn

BIN = HERE.parent.parent / ".cache" / "harnesses" / "node_modules" / ".bin"

pytestmark = pytest.mark.integration


def _codex(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    codex = BIN / "codex"
    if not codex.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{codex} is missing: run `make harnesses`")
        pytest.skip("Codex CLI is not installed (make harnesses)")
    home = tmp_path / "home" / ".codex"
    home.mkdir(parents=True)
    (home / "config.toml").write_text(
        'model = "gpt-5"\ncheck_for_update_on_startup = false\n[analytics]\nenabled = false\n'
    )
    env = {"CODEX_HOME": str(home), "HOME": str(home.parent), "OPENAI_API_KEY": "sk-codex-never-stored"}
    env["OPENAI_BASE_URL"] = ""
    return codex, env


def test_codex_in_intercept_mode_exits_0_with_its_call_recorded(tmp_path, standin, test_ca):
    codex, env = _codex(tmp_path)
    rec = run_intercept(
        tmp_path,
        standin,
        test_ca,
        [str(codex), "exec", "--skip-git-repo-check", "Say hi"],
        env=env,
        timeout=300,
    )
    assert "Hi!" in rec.proc.stdout
    # Codex first tries a WebSocket to /v1/responses (this HTTP stand-in refuses the upgrade), then
    # falls back to HTTPS: that call is recorded
    calls = [c for c in rec.calls if c.path == "/v1/responses"]
    assert len(calls) == 1 and calls[0].status == "ok" and calls[0].fidelity == "text"
    assert calls[0].completion["text"] == "Hi!" and calls[0].completion["reasoning"] == "The user greets me."
    assert calls[0].request_headers.get("authorization", "<redacted>") == "<redacted>"
    for f in tmp_path.glob("intercept.db*"):
        assert b"sk-codex-never-stored" not in f.read_bytes()


def test_codex_over_its_responses_websocket_is_recorded_call_by_call(tmp_path, standin, test_ca):
    """Codex's default transport for the real provider: a WebSocket to /v1/responses, reused for the turn."""
    codex, env = _codex(tmp_path)
    ws = WsStandIn(test_ca)
    try:
        rec = run_intercept(
            tmp_path,
            standin,
            test_ca,
            [str(codex), "exec", "--skip-git-repo-check", "Say hi"],
            *ws.resolve_args(),  # api.openai.com: the WebSocket stand-in
            env=env,
            timeout=300,
        )
    finally:
        ws.stop()
    assert "Done." in rec.proc.stdout
    assert ws.paths == ["/v1/responses"]  # one socket
    creates = [r for r in ws.received if r["type"] == "response.create"]
    assert creates[0].get("generate") is False and len(creates) == 3  # a warm-up, the call, its follow-up
    # the warm-up is no model call; the tool call and the follow-up on the same socket are one call each
    assert [(c.method, c.status) for c in rec.calls] == [("WEBSOCKET", "ok"), ("WEBSOCKET", "ok")]
    first, second = rec.calls
    assert first.completion["tool_calls"][0]["name"] == "ls"
    assert creates[2]["previous_response_id"] == "resp_ws_2"  # Codex sent only the new item...
    messages = second.conversation["messages"]  # ...and the record holds the whole conversation
    assert [m["role"] for m in messages][-2:] == ["assistant", "tool"]
    assert messages[-2]["tool_calls"][0]["id"] == "call_ws_2" and "unsupported call: ls" in str(messages[-1])
    assert any("Say hi" in str(m) for m in messages if m["role"] == "user")
    assert second.completion["text"] == "Done."
    for f in tmp_path.glob("intercept.db*"):
        assert b"sk-codex-never-stored" not in f.read_bytes()
