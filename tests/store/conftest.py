"""Fixtures for store tests: the store on both backends (a real SQLite file in a temporary folder, and a
fresh database on the session's real PostgreSQL 15), and request factories."""

from __future__ import annotations

from typing import Any

import pytest

from polarproxy.store import CallResult, CallStart, EpisodeStart, Store

BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture
def db_path(tmp_path):
    """A SQLite file path (for tests about SQLite itself)."""
    return tmp_path / "data" / "polarproxy.db"


def backend_url(request: pytest.FixtureRequest, backend: str, path) -> str:
    """A fresh, empty database of `backend`: the SQLite file `path`, or a new PostgreSQL database."""
    if backend == "sqlite":
        return str(path)
    return request.getfixturevalue("pg_server").create_database()


@pytest.fixture(params=BACKENDS)
def store_url(request, db_path) -> str:
    """A fresh database, once per backend: a SQLite path, or a postgresql:// URL."""
    return backend_url(request, request.param, db_path)


@pytest.fixture
def store(store_url):
    s = Store.open(store_url)
    yield s
    s.close()


def _call_start(episode_id: str, **overrides: Any) -> CallStart:
    values: dict[str, Any] = {
        "episode_id": episode_id,
        "dialect": "openai_chat",
        "method": "POST",
        "path": "/v1/chat/completions",
        "model": "tiny-qwen3",
        "stream": True,
        "request_headers": {"content-type": "application/json", "authorization": "<redacted>"},
        "request_body": '{"model": "tiny-qwen3", "messages": [{"role": "user", "content": "hi"}]}',
        "conversation": {"messages": [{"role": "user", "content": "hi"}], "tools": []},
        "prompt_ids": [151644, 872, 198, 6023, 151645],
    }
    values.update(overrides)
    return CallStart(**values)


def _ok_result(**overrides: Any) -> CallResult:
    values: dict[str, Any] = {
        "status": "ok",
        "http_status": 200,
        "response_body": '{"choices": []}',
        "completion": {"text": "hello", "reasoning": None, "tool_calls": [], "finish_reason": "stop"},
        "output_ids": [14990, 151645],
        "output_logprobs": [-0.25, -0.0078125],
        "finish_reason": "stop",
        "weight_version": "w0",
    }
    values.update(overrides)
    return CallResult(**values)


@pytest.fixture
def episode(store):
    return store.create_episode(EpisodeStart(command=["agent", "--task", "x"], harness="pi"))


@pytest.fixture
def call_start():
    """Factory: a CallStart for an episode, with keyword overrides."""
    return _call_start


@pytest.fixture
def ok_result():
    """Factory: an `ok` CallResult, with keyword overrides."""
    return _ok_result
