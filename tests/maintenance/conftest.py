"""The store on both backends (a SQLite file, a database on the session's PostgreSQL 15), this test's own
spool folder, and the CLI in process."""

from __future__ import annotations

import pytest
from factories import add_episode, call_start
from typer.testing import CliRunner

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
