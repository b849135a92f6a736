"""Test factories and readers shared across the suite (import as `from factories import ...`)."""

from __future__ import annotations

import json
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


def record_summary(stderr: str) -> dict[str, Any]:
    """The JSON summary `polarproxy record --json` prints on stderr once the harness has exited."""
    start = stderr.rindex('{\n  "episode_id"')
    return json.JSONDecoder().raw_decode(stderr[start:])[0]


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
