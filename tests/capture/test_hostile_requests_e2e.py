"""Hostile request bodies end to end through the real proxy (mitmproxy + recorder + gateway) in every wire
format: each gets a 4xx in the format's own error shape (never mitmproxy's HTML 502), is recorded as a
failed call with the reason, and the proxy goes on serving valid requests. The property-based fuzzing of
the same parsers, without sockets: tests/dialects/test_fuzz_requests.py."""

from __future__ import annotations

import httpx
import pytest
from test_dialect_faults import FORMATS, error_message

pytestmark = pytest.mark.integration

HUGE = 123456789012345678901234567890  # beyond 64 bits: orjson reads it as a float

HOSTILE = {
    "openai_chat": [
        ({"model": "m", "max_tokens": HUGE, "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"model": 7, "messages": [{"role": "user", "content": "hi"}]}, "model"),
        ({"model": "m", "messages": [{"role": "user"}]}, "content"),
        ({"model": "m", "messages": [{"role": ["user"], "content": "hi"}]}, "role"),
    ],
    "openai_responses": [
        ({"model": "m", "max_output_tokens": HUGE, "input": "hi"}, "max_output_tokens"),
        ({"model": {"x": 1}, "input": "hi"}, "model"),
    ],
    "anthropic": [
        ({"model": "m", "max_tokens": HUGE, "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        (
            {"model": "m", "max_tokens": 8, "top_k": 2**70, "messages": [{"role": "user", "content": "hi"}]},
            "top_k",
        ),
    ],
    "gemini": [
        (
            {"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": HUGE}},
            "maxOutputTokens",
        ),
        ({"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"seed": -(2**64)}}, "seed"),
    ],
}


@pytest.mark.parametrize("dialect", FORMATS)
def test_hostile_bodies_get_the_formats_own_4xx_and_the_proxy_keeps_serving(dialect, make_proxy, make_stub):
    proxy = make_proxy(make_stub("Fine.").url)
    path, valid = FORMATS[dialect]("hi")
    with httpx.Client(base_url=proxy.url, timeout=60) as client:
        for body, field in HOSTILE[dialect]:
            r = client.post(path, json=body)
            assert r.status_code == 400, (body, r.status_code, r.text[:300])
            assert r.headers["content-type"].startswith("application/json")
            assert field in error_message(dialect, r.json()), r.text
            ok = client.post(path, json=valid)  # still serving
            assert ok.status_code == 200, ok.text[:300]
    calls = proxy.store.list_calls(proxy.episode_id)
    failed = [c for c in calls if c.status == "failed"]
    assert len(failed) == len(HOSTILE[dialect]) and all(c.error.startswith("bad request:") for c in failed)
    assert sum(c.status == "ok" for c in calls) == len(HOSTILE[dialect])
