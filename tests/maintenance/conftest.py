"""The store on both backends (a SQLite file, a database on the session's PostgreSQL 15), this test's own
spool folder, and the CLI in process."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from polarproxy.store.records import CallResult, CallStart, EpisodeStart
from polarproxy.store.store import Store


@pytest.fixture(autouse=True)
def spool_root(tmp_path, monkeypatch):
    root = tmp_path / "spool"
    monkeypatch.setenv("POLARPROXY_SPOOL_DIR", str(root))
    return root


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "m.db"


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request, db_path) -> str:
    """A fresh database, once per backend: a SQLite path, or a new database on the session's PostgreSQL."""
    if request.param == "sqlite":
        return str(db_path)
    return str(request.getfixturevalue("pg_server").create_database())


@pytest.fixture
def store(db):
    s = Store.open(db)
    yield s
    s.close()


def call_start(episode_id: str, prompt: list[int], **kw: Any) -> CallStart:
    return CallStart(
        episode_id=episode_id,
        dialect="openai_chat",
        method="POST",
        path="/v1/chat/completions",
        model="m",
        stream=False,
        request_headers={},
        request_body="{}",
        conversation=None,
        prompt_ids=prompt,
        **kw,
    )


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


@pytest.fixture
def cli():
    from polarproxy.cli import app

    runner = CliRunner()

    def invoke(*args: str, input: str | None = None):
        return runner.invoke(app, list(args), input=input, catch_exceptions=False)

    return invoke


@pytest.fixture
def make_episode():
    """make_episode(store, turns=3, end='ok') -> (episode ID, call IDs), each call extending the last."""
    return add_episode


@pytest.fixture
def make_start():
    """make_start(episode_id, prompt_ids, **fields) -> CallStart."""
    return call_start
