"""Fixtures for store tests: a real SQLite file in a temporary folder, and request factories."""

from __future__ import annotations

from typing import Any

import pytest

from polarproxy.store import CallResult, CallStart, EpisodeStart, Store


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "data" / "polarproxy.db"


@pytest.fixture
def store(db_path):
    s = Store.open(db_path)
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
