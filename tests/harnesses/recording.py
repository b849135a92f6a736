"""Helpers for the real harness CLI tests: where the CLIs are, what a recorded run is, common checks."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from polarproxy.conversation import Conversation
from polarproxy.render.renderer import Renderer

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".cache" / "harnesses" / "node_modules" / ".bin"


def needs_cli(name: str, package: str) -> pytest.MarkDecorator:
    """Skip when the CLI is not installed, except in CI (CI=true), where `make test` installs it first:
    there a missing CLI must fail the run, not hide it."""
    return pytest.mark.skipif(
        not (BIN / name).exists() and not os.environ.get("CI"),
        reason=f"{package} not installed: `make harnesses` installs it (make test does this first)",
    )


@dataclass
class Recorded:
    proc: subprocess.CompletedProcess[str]
    episode: Any
    calls: list[Any]
    db: Path
    seconds: float

    def tails(self) -> str:
        return f"stdout:\n{self.proc.stdout[-3000:]}\nstderr:\n{self.proc.stderr[-3000:]}"


def check_calls(rec: Recorded, model_dir: Path, *, dialect: str, auth_header: str) -> None:
    """Every call ok, in `dialect`, its key redacted, one logprob per sampled token, prompt as rendered."""
    renderer = Renderer(model_dir)
    for call in rec.calls:
        assert call.status == "ok", (call.path, call.status, call.error, rec.tails())
        assert call.dialect == dialect, (call.dialect, call.path)
        assert call.request_headers.get(auth_header) == "<redacted>", call.request_headers
        assert len(call.output_ids) == len(call.output_logprobs) > 0
        if call.extended_from is None:
            assert call.prompt_ids == renderer.render(Conversation.from_dict(call.conversation)).ids


def scripted_backend(
    make_backend, model_dir: Path, tmp_path: Path, tool: str, arguments: dict[str, Any]
) -> str:
    """A backend that answers the first tool-offering call with one `tool` call, then FINAL (see
    polarproxy/backends/local/script.py); returns its URL."""
    script = tmp_path / "script.json"
    step = {"reasoning": "I will list the files.", "tool_calls": [{"name": tool, "arguments": arguments}]}
    script.write_text(json.dumps({"steps": [step], "final": FINAL, "side_answer": "Listing files"}))
    return make_backend(model_dir, "--script", str(script)).url


FINAL = "The folder holds README.md and hello.py. Done."


def check_tool_loop(rec: Recorded, tool: str) -> tuple[Any, Any]:
    """The harness ran the scripted tool call, sent its result back, and printed the final answer; the
    second turn's prompt extends the first's prompt + sampled output (T2). Returns the two main calls."""
    main = [c for c in rec.calls if c.conversation and c.conversation["tools"]]
    assert len(main) >= 2, ([c.completion for c in rec.calls], rec.tails())
    first, second = main[0], main[1]
    assert first.completion["tool_calls"][0]["name"] == tool
    assert first.completion["reasoning"] == "I will list the files."
    results = [m for m in second.conversation["messages"] if m["role"] == "tool"]
    assert results and "README.md" in results[-1]["content"], results  # the harness really ran `ls`
    assert second.completion["text"] == FINAL and FINAL in rec.proc.stdout
    assert second.render_mode == "extended" and second.extended_from == first.id, second.render_note
    n = len(first.prompt_ids) + len(first.output_ids)
    assert second.prompt_ids[:n] == first.prompt_ids + first.output_ids
    return first, second
