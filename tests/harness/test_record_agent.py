"""`polarproxy record` wrapping a real agent process, against the real local backend over the tiny model."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from factories import record_summary

from polarproxy.conversation import Conversation
from polarproxy.export.schema import load_schema
from polarproxy.render.renderer import Renderer
from polarproxy.store.store import Store

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def last_json(stdout: str) -> dict:
    return record_summary(stdout)


@pytest.fixture(scope="module")
def recorded(backend, tiny_model_dir, tmp_path_factory):
    ws = tmp_path_factory.mktemp("ws")
    (ws / "README.md").write_text("# Sample\n\nA sample project.\n")
    (ws / "main.py").write_text("print('hi')\n")
    db = tmp_path_factory.mktemp("db") / "rec.db"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "polarproxy",
            "record",
            "--backend",
            backend.url,
            "--model",
            str(tiny_model_dir),
            "--db",
            str(db),
            "--task",
            "list-and-read",
            "--json",
            "--",
            sys.executable,
            str(REPO / "examples" / "tool_agent.py"),
        ],
        cwd=ws,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return r, db


def test_record_exits_with_the_agents_code_and_summarises(recorded):
    r, _ = recorded
    assert r.returncode == 0, r.stderr
    summary = last_json(r.stderr)
    assert summary["exit_code"] == 0 and summary["calls"] == 3 and summary["statuses"] == {"ok": 3}


def test_the_agent_saw_streamed_answers_and_ran_the_tool_loop(recorded):
    r, _ = recorded
    turns = [json.loads(line) for line in r.stdout.splitlines() if line.startswith('{"turn"')]
    assert [t["tool_calls"] for t in turns] == [["list_files"], ["read_file"], []]
    assert all(t["chunks"] > 2 for t in turns), turns  # role chunk, deltas, finish: a real stream


def test_every_call_is_complete_and_token_exact(recorded, tiny_model_dir):
    from polarproxy.backends.local.model_runner import ModelRunner

    r, db = recorded
    store = Store.open(str(db))
    episode = store.get_episode(last_json(r.stderr)["episode_id"])
    assert episode.status == "ok" and episode.exit_code == 0 and episode.task == "list-and-read"
    calls = store.list_calls(episode.id)
    renderer = Renderer(tiny_model_dir)
    runner = ModelRunner(tiny_model_dir)
    for call in calls:
        assert call.status == "ok" and call.stream and call.dialect == "openai_chat"
        # T1: the prompt the backend consumed is the template's rendering of the request
        conv = Conversation.from_dict(call.conversation)
        assert call.prompt_ids == renderer.render(conv).ids
        assert call.output_ids[-1] in renderer.stop_token_ids  # the stop token is kept
        assert len(call.output_logprobs) == len(call.output_ids)
        assert call.finish_reason in ("stop", "tool_calls") and call.weight_version == "default"
        # the logprobs are the model's own: a teacher-forced forward pass gives the same numbers
        scored = runner.score(call.prompt_ids, call.output_ids)
        assert max(abs(a - b) for a, b in zip(scored, call.output_logprobs, strict=True)) < 1e-4
        assert call.ttft_ms is not None and call.latency_ms >= call.ttft_ms
    assert [c.finish_reason for c in calls] == ["tool_calls", "tool_calls", "stop"]
    # T2: each later call extends the one before it: earlier prompt + earlier output + the new messages
    assert [c.render_mode for c in calls] == ["fresh", "extended", "extended"]
    for prev, cur in itertools.pairwise(calls):
        assert cur.extended_from == prev.id
        assert (
            cur.prompt_ids[: len(prev.prompt_ids) + len(prev.output_ids)] == prev.prompt_ids + prev.output_ids
        )
    assert calls[2].completion["text"] == "Done."


def test_no_key_reaches_the_database(recorded):
    _, db = recorded
    for f in db.parent.glob("rec.db*"):
        assert b"sk-polarproxy-local" not in f.read_bytes()


def test_per_request_export_of_the_episode_is_schema_valid(recorded, tmp_path):
    _r, db = recorded
    out = tmp_path / "calls.jsonl"
    e = subprocess.run(
        [
            sys.executable,
            "-m",
            "polarproxy",
            "export",
            "--db",
            str(db),
            "--strategy",
            "per-request",
            "--format",
            "jsonl",
            "--out",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert e.returncode == 0, e.stderr
    assert json.loads(e.stdout)["rows"] == 3
    schema = load_schema("export-row.v3")
    store = Store.open(str(db))
    for line in out.read_text().splitlines():
        row = json.loads(line)
        jsonschema.validate(row, schema)
        (call,) = [store.get_call(row["call_ids"][0])]
        assert row["input_ids"] == call.prompt_ids + call.output_ids
        assert row["loss_mask"] == [0] * len(call.prompt_ids) + [1] * len(call.output_ids)
        assert row["logprobs"][len(call.prompt_ids) :] == pytest.approx(call.output_logprobs, abs=0)


def test_show_and_ls_read_the_episode(recorded):
    r, db = recorded
    ep = last_json(r.stderr)["episode_id"]
    ls = subprocess.run(
        [sys.executable, "-m", "polarproxy", "ls", "--db", str(db), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert [e["id"] for e in json.loads(ls.stdout)] == [ep]
    show = subprocess.run(
        [sys.executable, "-m", "polarproxy", "show", ep[:8], "--db", str(db), "--tokens"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert show.returncode == 0, show.stderr
    assert "list_files" in show.stdout and "Done." in show.stdout


def test_the_example_agent_run_from_the_repository_root_looks_at_its_own_small_workspace(monkeypatch):
    """The README's `record ... -- python examples/tool_agent.py` runs in the checkout's root: the agent's
    tools then look at examples/workspace/, not the whole checkout (.venv included: a 2.9 M-token prompt)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tool_agent", REPO / "examples" / "tool_agent.py")
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    monkeypatch.chdir(REPO)
    ws = agent.workspace(None)
    assert ws == REPO / "examples" / "workspace"
    monkeypatch.chdir(ws)
    assert agent.run_tool("list_files", '{"path": "."}').split("\n") == ["README.md", "main.py"]
