"""Faults in every wire format: a backend that is down, and a request too large for the model's context,
each answered with that format's own error shape, recorded with the reason, and the proxy keeps serving."""

from __future__ import annotations

import httpx
import pytest
from factories import free_port

pytestmark = pytest.mark.integration


def chat(text: str) -> tuple[str, dict]:
    return "/v1/chat/completions", {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": text}],
    }


def responses(text: str) -> tuple[str, dict]:
    return "/v1/responses", {"model": "m", "max_output_tokens": 8, "input": text}


def anthropic(text: str) -> tuple[str, dict]:
    return "/v1/messages", {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": text}]}


def gemini(text: str) -> tuple[str, dict]:
    return "/v1beta/models/m:generateContent", {
        "contents": [{"role": "user", "parts": [{"text": text}]}],
        "generationConfig": {"maxOutputTokens": 8},
    }


def error_message(dialect: str, body: dict) -> str:
    """The message, read the way that format's clients read it."""
    if dialect == "anthropic":
        assert body["type"] == "error"
        return body["error"]["message"]
    if dialect == "gemini":
        assert isinstance(body["error"]["code"], int) and body["error"]["status"]
        return body["error"]["message"]
    assert body["error"]["type"]
    return body["error"]["message"]


FORMATS = {"openai_chat": chat, "openai_responses": responses, "anthropic": anthropic, "gemini": gemini}


@pytest.mark.parametrize("dialect", FORMATS)
def test_backend_down(dialect, make_proxy):
    proxy = make_proxy(f"http://127.0.0.1:{free_port()}", check_backend=False)
    path, body = FORMATS[dialect]("hi")
    r = httpx.post(proxy.url + path, json=body, timeout=30)
    assert r.status_code == 503
    assert "unreachable" in error_message(dialect, r.json())
    (call,) = proxy.store.list_calls(proxy.episode_id)
    assert (
        call.dialect == dialect and call.status == "failed" and call.error.startswith("backend_unreachable")
    )
    r2 = httpx.post(proxy.url + path, json=body, timeout=30)  # still serving
    assert r2.status_code == 503


@pytest.mark.parametrize("dialect", FORMATS)
def test_request_too_large_for_the_context(dialect, backend, make_proxy):
    proxy = make_proxy(backend.url)
    # the tiny model's context is 65,536 tokens; this renders to well over that
    path, body = FORMATS[dialect]("lorem ipsum dolor sit amet " * 14000)
    r = httpx.post(proxy.url + path, json=body, timeout=120)
    assert r.status_code == 400
    assert "context length" in error_message(dialect, r.json())
    (call,) = proxy.store.list_calls(proxy.episode_id)
    # refused by the gateway before the backend spends a prefill on it
    assert call.status == "failed" and call.error.startswith("The prompt is") and call.http_status == 400
    assert len(call.prompt_ids) > 65536  # the prompt that was refused is kept
    path, small = FORMATS[dialect]("hi")
    assert httpx.post(proxy.url + path, json=small, timeout=120).status_code == 200
