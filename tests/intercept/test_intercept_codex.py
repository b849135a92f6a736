"""The real Codex CLI, unmodified, talking to "api.openai.com" (a stand-in) through intercept mode."""

from __future__ import annotations

import os

import pytest
from intercept_run import HERE, run_intercept

BIN = HERE.parent.parent / ".cache" / "harnesses" / "node_modules" / ".bin"

pytestmark = pytest.mark.integration


def test_codex_in_intercept_mode_exits_0_with_its_call_recorded(tmp_path, standin, test_ca):
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
    rec = run_intercept(
        tmp_path,
        standin,
        test_ca,
        [str(codex), "exec", "--skip-git-repo-check", "Say hi"],
        env=env,
        timeout=300,
    )
    assert "Hi!" in rec.proc.stdout
    # Codex first tries a WebSocket to /v1/responses (the stand-in refuses it: not recorded, see docs), then
    # falls back to HTTPS: that call is recorded
    calls = [c for c in rec.calls if c.path == "/v1/responses"]
    assert len(calls) == 1 and calls[0].status == "ok" and calls[0].fidelity == "text"
    assert calls[0].completion["text"] == "Hi!" and calls[0].completion["reasoning"] == "The user greets me."
    assert calls[0].request_headers.get("authorization", "<redacted>") == "<redacted>"
    for f in tmp_path.glob("intercept.db*"):
        assert b"sk-codex-never-stored" not in f.read_bytes()
