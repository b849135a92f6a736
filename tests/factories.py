"""Test factories and readers shared across the suite (import as `from factories import ...`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from polarproxy.store.records import CallResult, CallStart, EpisodeStart
from polarproxy.store.store import Store

TEMPLATES = Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "chat-templates"  # ../shared


def shared_template(name: str) -> Path:
    """A real chat template of ../shared/fixtures/chat-templates (`qwen3` or `qwen3.jinja`); the test is
    skipped, saying why, in a checkout without ../shared beside it (CI has it)."""
    path = TEMPLATES / (name if name.endswith(".jinja") else f"{name}.jinja")
    if not path.is_file():
        pytest.skip(
            f"{path} is absent: the real templates live in ../shared beside the checkout (CI has them)"
        )
    return path


REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port free on loopback now (bound and released: another process may take it before use)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


QWEN3_4B = {  # Qwen3-4B's config.json: the plan needs nothing else (no weights are read)
    "architectures": ["Qwen3ForCausalLM"], "head_dim": 128, "hidden_act": "silu", "hidden_size": 2560,
    "intermediate_size": 9728, "max_position_embeddings": 40960, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000, "tie_word_embeddings": True, "vocab_size": 151936,
}  # fmt: skip


def record_summary(stderr: str) -> dict[str, Any]:
    """The JSON summary `polarproxy record --json` prints on stderr once the harness has exited."""
    start = stderr.rindex('{\n  "episode_id"')
    return json.JSONDecoder().raw_decode(stderr[start:])[0]


def record_tool_agent(
    backend_url: str,
    model: Path,
    db: Path,
    ws: Path,
    group: str,
    reward: int,
    *extra: str,
    exit_codes: tuple[int, ...] = (0,),
) -> str:
    """Record examples/tool_agent.py in `ws` under `polarproxy record --json` into `db`, in task `task-GROUP`
    and group GROUP, with `reward` given by a `--reward-cmd`; the episode's ID. `exit_codes`: the agent's
    allowed (1: a sample at temperature 1 that did not finish in its six turns)."""
    argv = [sys.executable, "-m", "polarproxy", "record", "--backend", backend_url, "--model", str(model)]
    argv += ["--db", str(db), "--task", f"task-{group}", "--group", group, "--json"]
    argv += [
        "--reward-cmd",
        f"exit {1 - reward}",
        *extra,
        "--",
        sys.executable,
        str(REPO / "examples" / "tool_agent.py"),
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # this checkout's polarproxy, run from the workspace
    r = subprocess.run(argv, cwd=ws, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode in exit_codes, r.stderr[-2000:]
    return record_summary(r.stderr)["episode_id"]


TWO_GROUPS = {"g1": (1, 0), "g2": (0, 1)}  # each group: two samples, one solved (reward 1) of two


def record_groups(
    backend_url: str,
    model: Path,
    where: Path,
    groups: dict[str, tuple[int, ...]],
    *extra: str,
    exit_codes: tuple[int, ...] = (0,),
) -> Path:
    """A store in `where` of examples/tool_agent.py recorded in a small workspace of its own: per group, one
    episode per reward (`record_tool_agent`); the database's path."""
    ws = where / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("# Sample\n\nA sample project.\n")
    (ws / "main.py").write_text("print('hi')\n")
    db = where / "rec.db"
    for group, rewards in groups.items():
        for reward in rewards:
            record_tool_agent(backend_url, model, db, ws, group, reward, *extra, exit_codes=exit_codes)
    return db


def call_start(episode_id: str, prompt: list[int], **kw: Any) -> CallStart:
    """A chat-completions CallStart with `prompt`; any field can be given in `kw` (it replaces the default)."""
    fields: dict[str, Any] = {
        "dialect": "openai_chat",
        "method": "POST",
        "path": "/v1/chat/completions",
        "model": "m",
        "stream": False,
        "request_headers": {},
        "request_body": "{}",
        "conversation": None,
    }
    return CallStart(episode_id=episode_id, prompt_ids=prompt, **{**fields, **kw})


def add_episode(store: Store, turns: int = 3, *, end: str | None = "ok") -> tuple[str, list[str]]:
    """An episode whose every call extends the previous one (prompt = previous prompt + output + 4 new)."""
    ep = store.create_episode(EpisodeStart(command=["agent"]))
    prompt = list(range(100, 120))
    ids = []
    prev = None
    for t in range(turns):
        cid, _ = store.begin_call(
            call_start(ep, prompt, extended_from=prev, render_mode="extended" if prev else "fresh")
        )
        out = [7000 + t, 7001 + t, 2]
        store.finish_call(cid, CallResult(status="ok", output_ids=out, output_logprobs=[-0.5] * 3))
        ids.append(cid)
        prev = cid
        prompt = [*prompt, *out, 300 + t, 301 + t, 302 + t, 303 + t]
    if end:
        store.finish_episode(ep, status=end, exit_code=0)  # type: ignore[arg-type]
    return ep, ids
