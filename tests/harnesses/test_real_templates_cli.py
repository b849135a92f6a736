"""Real harness CLIs (Qwen Code, Codex, Claude Code) under `polarproxy record --harness` on tiny models
that carry real chat templates (Qwen3: hermes JSON tool calls and `<think>`; Qwen3-Coder: XML tool calls).
A scripted backend answers in the template's own family format; each CLI gets two tool calls back parsed,
runs them, sends the results, prints the final answer and exits 0, and every follow-up call extends the
one before (T2) although the CLI re-serializes the whole history on every turn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from factories import record_summary
from recording import (
    BIN,
    FINAL,
    Recorded,
    check_calls,
    check_extends,
    check_side_requests,
    check_tool_loops,
    main_calls,
    needs_cli,
    scripted_backend,
    tool_result_text,
)

from polarproxy.harness.env import PLACEHOLDER_KEY
from polarproxy.render.renderer import Renderer
from polarproxy.store.store import Store
from polarproxy.tiny.formats import detect_family

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "tiny"))
from test_tiny_any_template import cached_model  # noqa: E402

pytestmark = pytest.mark.integration
TEMPLATES = {"qwen3": "hermes", "qwen3-coder-xml-tools": "qwen-xml"}  # template -> its family's format


def run_record(
    tmp_path: Path, model: Path, backend_url: str, preset: str, argv: Sequence[str], *flags: str
) -> Recorded:
    """`polarproxy record --harness preset ... -- argv` on `model` in a small workspace (README.md,
    hello.py), as tests/harnesses/conftest.py `record_harness` runs it for the default tiny model."""
    ws = tmp_path / "ws"
    ws.mkdir(exist_ok=True)
    (ws / "README.md").write_text("# hello\n")
    (ws / "hello.py").write_text("print('hello')\n")
    db = tmp_path / f"{preset}.db"
    cmd = [sys.executable, "-m", "polarproxy", "record", "--backend", backend_url, "--model", str(model)]
    cmd += ["--db", str(db), "--harness", preset, *flags, "--json", "--", *argv]
    t0 = time.perf_counter()
    r = subprocess.run(
        cmd,
        cwd=ws,
        env={**os.environ, "NO_COLOR": "1", "PWD": str(ws)},
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - t0
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    summary = record_summary(r.stderr)
    store = Store.open(str(db))
    rec = Recorded(
        r, store.get_episode(summary["episode_id"]), store.list_calls(summary["episode_id"]), db, seconds
    )
    print(f"{preset} on {model.name}: {len(rec.calls)} calls in {seconds:.1f} s")
    assert rec.calls and rec.episode.harness == preset and rec.episode.status == "ok", rec.tails()
    for f in tmp_path.glob(f"{preset}.db*"):
        assert PLACEHOLDER_KEY.encode() not in f.read_bytes(), f"the placeholder key reached {f.name}"
    return rec


# harness -> (preset, argv, extra record flags, dialect, auth header, tool, its two argument sets)
HARNESSES: dict[str, tuple[str, list[str], list[str], str, str, str, list[dict[str, Any]]]] = {
    "qwen": (
        "qwen",
        [str(BIN / "qwen"), "-p", "List the files, read README.md, then say done.", "--yolo"],
        ["--model-name", "tiny"],
        "openai_chat",
        "authorization",
        "run_shell_command",
        [{"command": "ls"}, {"command": "cat README.md"}],
    ),
    "codex": (
        "codex",
        [
            str(BIN / "codex"),
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "List the files, read README.md, then say done.",
        ],
        [],
        "openai_responses",
        "authorization",
        "exec_command",
        [{"cmd": "ls"}, {"cmd": "cat README.md"}],
    ),
    "claude": (
        "claude",
        [
            str(BIN / "claude"),
            "-p",
            "List the files, read README.md, then say done.",
            "--dangerously-skip-permissions",
        ],
        [],
        "anthropic",
        "x-api-key",
        "Bash",
        [{"command": "ls", "description": "List"}, {"command": "cat README.md", "description": "Read"}],
    ),
}
CLI = {"qwen": "Qwen Code CLI", "codex": "Codex CLI", "claude": "Claude Code CLI"}


# Codex and Claude Code (their own dialects) on both templates; Qwen Code on the XML one, the format
# furthest from the tiny template's (its ~28k-token prompts cost about two minutes a run on 2 cores; on the
# hermes format it runs in test_qwen_code_scripted.py)
RUNS = [("codex", "qwen3"), ("codex", "qwen3-coder-xml-tools"), ("claude", "qwen3")]
RUNS += [("claude", "qwen3-coder-xml-tools"), ("qwen", "qwen3-coder-xml-tools")]


@pytest.mark.parametrize(
    ("harness", "template"),
    [pytest.param(h, t, marks=needs_cli(h, CLI[h]), id=f"{h}-{t}") for h, t in RUNS],
)
def test_a_real_cli_runs_two_tool_calls_on_a_real_template_and_every_follow_up_extends(
    harness: str, template: str, make_backend: Callable[..., Any], tmp_path: Path
):
    preset, argv, flags, dialect, auth, tool, args = HARNESSES[harness]
    model = cached_model(template)
    renderer = Renderer(model)
    assert detect_family(renderer.tokenizer.chat_template).name == TEMPLATES[template]
    url = scripted_backend(make_backend, model, tmp_path, tool, args[0], (tool, args[1]))
    rec = run_record(tmp_path, model, url, preset, argv, *flags)
    check_calls(rec, model, dialect=dialect, auth_header=auth)
    # both tool calls came back parsed and ran (their output is in the next request), then FINAL;
    # each main call extends the previous one's prompt + output (T2)
    if detect_family(renderer.tokenizer.chat_template).reasoning:
        main = check_tool_loops(rec, [tool, tool], ["hello.py", "# hello"])
    else:  # Qwen3-Coder's template has no `<think>`: the script's reasoning is not written
        main = check_tool_loops_without_reasoning(rec, tool, ["hello.py", "# hello"])
    check_side_requests(rec)
    for call, expected in zip(main, args, strict=False):
        assert [json.loads(t["arguments"]) for t in call.completion["tool_calls"]] == [expected]
    # the sampled tokens are the family's own format: the template's tool-call markers
    first = renderer.decode(main[0].output_ids)
    assert ("<function=" in first) == (TEMPLATES[template] == "qwen-xml"), first
    assert "<tool_call>" in first and main[0].output_ids[-1] in renderer.stop_token_ids


def check_tool_loops_without_reasoning(rec: Recorded, tool: str, results: Sequence[str]) -> list[Any]:
    """recording.check_tool_loops for a family without reasoning: each scripted `tool` call ran and its
    result (holding results[i]) went back, FINAL was printed, and each main call extends the one before."""
    main = main_calls(rec)
    n = len(results)
    assert len(main) >= n + 1, ([(c.path, c.completion) for c in rec.calls], rec.tails())
    main = main[: n + 1]
    for i in range(n):
        done = main[i].completion
        assert [t["name"] for t in done["tool_calls"]] == [tool] and done["reasoning"] is None, (i, done)
        sent_back = [m for m in main[i + 1].conversation["messages"] if m["role"] == "tool"]
        assert len(sent_back) >= i + 1 and results[i] in tool_result_text(sent_back[-1]), sent_back
    assert main[n].completion["text"] == FINAL and not main[n].completion["tool_calls"], main[n].completion
    assert FINAL in rec.proc.stdout, rec.tails()
    for i in range(1, n + 1):
        check_extends(main[i], main[i - 1])
    return main
