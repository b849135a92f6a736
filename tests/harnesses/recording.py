"""Helpers for the real harness CLI tests: where the CLIs are, what a recorded run is, common checks."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from polarproxy.conversation import Conversation
from polarproxy.render.renderer import Renderer

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / ".cache" / "harnesses" / "node_modules" / ".bin"


AIDER = REPO / ".cache" / "aider-venv" / "bin" / "aider"  # `make harnesses` installs it in its own venv


def needs_cli(name: str, package: str, path: Path | None = None) -> pytest.MarkDecorator:
    """Skip when the CLI (`BIN/name`, or `path`) is not installed, except in CI (CI=true), where
    `make test` installs it first: there a missing CLI must fail the run, not hide it."""
    return pytest.mark.skipif(
        not (path or BIN / name).exists() and not os.environ.get("CI"),
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
        headers = {k.lower(): v for k, v in call.request_headers.items()}  # as sent: case varies
        assert headers.get(auth_header.lower()) == "<redacted>", call.request_headers
        assert len(call.output_ids) == len(call.output_logprobs) > 0
        if call.extended_from is None:
            assert call.prompt_ids == renderer.render(Conversation.from_dict(call.conversation)).ids


def scripted_backend(
    make_backend,
    model_dir: Path,
    tmp_path: Path,
    tool: str,
    arguments: dict[str, Any],
    *more: tuple[str, dict[str, Any]],
) -> str:
    """A backend that answers the tool-offering calls with one `tool` call, then one call per `more`
    (name, arguments) in turn, then FINAL; calls without tools get SIDE_ANSWER (see
    polarproxy/backends/local/script.py). Returns its URL."""
    calls = [(tool, arguments), *more]
    steps = [
        {"reasoning": reasoning_for(i), "tool_calls": [{"name": name, "arguments": args}]}
        for i, (name, args) in enumerate(calls)
    ]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"steps": steps, "final": FINAL, "side_answer": SIDE_ANSWER}))
    return make_backend(model_dir, "--script", str(script)).url


FINAL = "The folder holds README.md and hello.py. Done."
SIDE_ANSWER = "Listing files"


def reasoning_for(step: int) -> str:
    """The scripted reasoning of tool step `step` (0-based)."""
    return "I will list the files." if step == 0 else f"Step {step + 1}: one more command."


def main_calls(rec: Recorded) -> list[Any]:
    """The calls that offered tools: the harness's agent turns."""
    return [c for c in rec.calls if c.has_tools]


def check_tool_loop(rec: Recorded, tool: str) -> tuple[Any, Any]:
    """The harness ran the scripted tool call, sent its result back, and printed the final answer; the
    second turn's prompt extends the first's prompt + sampled output (T2). Returns the two main calls."""
    main = main_calls(rec)
    assert len(main) >= 2, ([c.completion for c in rec.calls], rec.tails())
    first, second = main[0], main[1]
    assert first.completion["tool_calls"][0]["name"] == tool
    assert first.completion["reasoning"] == reasoning_for(0)
    results = [m for m in second.conversation["messages"] if m["role"] == "tool"]
    assert results and "README.md" in results[-1]["content"], results  # the harness really ran `ls`
    assert second.completion["text"] == FINAL and FINAL in rec.proc.stdout
    check_extends(second, first)
    return first, second


def check_extends(later: Any, earlier: Any) -> None:
    """`later`'s prompt was recognised as extending `earlier`'s prompt + sampled output (T2)."""
    assert later.render_mode == "extended" and later.extended_from == earlier.id, (
        later.render_mode,
        later.extended_from,
        earlier.id,
        later.render_note,
    )
    n = len(earlier.prompt_ids) + len(earlier.output_ids)
    assert later.prompt_ids[:n] == earlier.prompt_ids + earlier.output_ids


def tool_result_text(message: dict[str, Any]) -> str:
    """The text of a neutral tool-result message (content as a string or as parts)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    return json.dumps(content)


def check_tool_loops(
    rec: Recorded, tools: Sequence[str], results: Sequence[str], *, appends: bool = True
) -> list[Any]:
    """The harness ran each scripted tool call in turn (`tools[i]`), sent back a result holding
    `results[i]`, and printed FINAL after the last; with `appends`, each main call's prompt extends the
    previous main call's prompt + output (T2). Returns the main calls, the final answer's last."""
    assert len(tools) == len(results) >= 1
    main = main_calls(rec)
    n = len(tools)
    assert len(main) >= n + 1, ([(c.path, c.completion) for c in rec.calls], rec.tails())
    main = main[: n + 1]
    for i, tool in enumerate(tools):
        done = main[i].completion
        assert [t["name"] for t in done["tool_calls"]] == [tool], (i, done)
        assert done["reasoning"] == reasoning_for(i), (i, done)
        sent_back = [m for m in main[i + 1].conversation["messages"] if m["role"] == "tool"]
        assert len(sent_back) >= i + 1, (i, main[i + 1].conversation["messages"])
        assert results[i] in tool_result_text(sent_back[-1]), (i, sent_back[-1])  # the harness ran it
    assert main[n].completion["text"] == FINAL, main[n].completion
    assert not main[n].completion["tool_calls"]
    assert FINAL in rec.proc.stdout, rec.tails()
    if appends:
        for i in range(1, n + 1):
            check_extends(main[i], main[i - 1])
    return main


def check_side_requests(rec: Recorded, *, at_least: int = 0) -> list[Any]:
    """Calls that offered no tools (titles, routers, commit messages): ordinary, fully recorded calls of
    the episode with `has_tools` False, answered with SIDE_ANSWER. Returns them."""
    side = [c for c in rec.calls if not c.has_tools]
    assert len(side) >= at_least, ([c.path for c in rec.calls], rec.tails())
    for c in side:
        assert c.has_tools is False and c.episode_id == rec.episode.id
        assert c.status == "ok" and c.prompt_ids and c.output_ids
        assert len(c.output_logprobs) == len(c.output_ids)
        assert SIDE_ANSWER in (c.completion["text"] or ""), c.completion
    return side
