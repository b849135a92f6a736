"""The real Pi coding agent (npm @mariozechner/pi-coding-agent), unmodified, through `--harness pi --api X`:
one harness, all four wire formats."""

from __future__ import annotations

import json

import pytest
from recording import BIN, check_calls, check_side_requests, check_tool_loops, needs_cli, scripted_backend

pytestmark = [pytest.mark.integration, needs_cli("pi", "Pi coding agent")]


@pytest.mark.parametrize(
    "api, dialect, path, auth",
    [
        ("chat", "openai_chat", "/v1/chat/completions", "authorization"),
        ("responses", "openai_responses", "/v1/responses", "authorization"),
        ("anthropic", "anthropic", "/v1/messages", "x-api-key"),
        ("gemini", "gemini", "/v1beta/models/tiny:streamGenerateContent", "x-goog-api-key"),
    ],
)
def test_pi_exits_0_in_each_wire_format(record_harness, tiny_model_dir, api, dialect, path, auth):
    argv = [
        str(BIN / "pi"),
        "-p",
        "--provider",
        "polarproxy",
        "--model",
        "tiny",
        "List the files, then say done.",
    ]
    rec = record_harness("pi", argv, "--api", api, "--model-name", "tiny")
    check_calls(rec, tiny_model_dir, dialect=dialect, auth_header=auth)
    assert all(c.path.startswith(path) and c.stream for c in rec.calls), [c.path for c in rec.calls]
    assert rec.episode.metadata["api"] == api
    assert json.loads(rec.calls[0].request_body)  # the harness's own body, stored as sent


@pytest.mark.parametrize(
    "api, dialect, auth",
    [
        ("chat", "openai_chat", "authorization"),
        ("responses", "openai_responses", "authorization"),
        ("anthropic", "anthropic", "x-api-key"),
        ("gemini", "gemini", "x-goog-api-key"),
    ],
)
def test_pi_tool_loop_in_each_wire_format(
    record_harness, make_backend, tiny_model_dir, tmp_path, api, dialect, auth
):
    """Two bash commands, then the final answer, in each wire format: Pi appends, so each later call
    extends the one before (T2), whatever reasoning form it sends back; Pi makes no side requests."""
    url = scripted_backend(
        make_backend,
        tiny_model_dir,
        tmp_path,
        "bash",
        {"command": "ls"},
        ("bash", {"command": "cat README.md"}),
    )
    argv = [str(BIN / "pi"), "-p", "--provider", "polarproxy", "--model", "tiny"]
    argv.append("List the files, read README.md, then say done.")
    rec = record_harness("pi", argv, "--api", api, "--model-name", "tiny", backend_url=url)
    check_calls(rec, tiny_model_dir, dialect=dialect, auth_header=auth)
    main = check_tool_loops(rec, ["bash", "bash"], ["hello.py", "# hello"])
    assert len(main) == len(rec.calls) == 3 and all(c.stream for c in rec.calls)
    assert check_side_requests(rec) == []


def test_pi_runs_with_its_usual_command_the_proxy_being_its_default(record_harness, tiny_model_dir):
    """`pi -p "P"` without --provider/--model: the preset's settings.json makes the proxy Pi's default."""
    rec = record_harness("pi", [str(BIN / "pi"), "-p", "List the files, then say done."])
    assert rec.proc.returncode == 0, rec.tails()
    assert "Connection error" not in rec.proc.stdout + rec.proc.stderr
    check_calls(rec, tiny_model_dir, dialect="openai_chat", auth_header="authorization")
    assert rec.calls and json.loads(rec.calls[0].request_body)["model"] == tiny_model_dir.name
