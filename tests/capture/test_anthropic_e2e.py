"""Anthropic Messages through the real proxy, read by the real `anthropic` SDK."""

from __future__ import annotations

import httpx
import orjson
import pytest

from polarproxy.sse import SSEDecoder

pytestmark = pytest.mark.integration

PATH = "/v1/messages?beta=true"
REPLY = (
    '<think>\nhmm\n</think>\n\nHello <tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>'
)
BODY = {"model": "tiny", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
KEY = "sk-ant-SECRET-123"


def calls(proxy):
    return proxy.store.list_calls(proxy.episode_id)


@pytest.fixture
def client(make_proxy):
    """client(proxy) -> a real SDK client for it, closed before the proxy stops."""
    import anthropic

    made = []

    def make(proxy):
        made.append(anthropic.Anthropic(base_url=proxy.url, api_key=KEY, max_retries=0))
        return made[-1]

    yield make
    for c in made:
        c.close()


def check_message(msg) -> None:
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use"]
    assert msg.content[0].thinking == "hmm"
    assert msg.content[0].signature == "polarproxy:" + msg.id.removeprefix("msg_")
    assert msg.content[1].text == "Hello"
    assert msg.content[2].name == "ls" and msg.content[2].input == {"path": "."}
    assert msg.stop_reason == "tool_use"
    assert msg.usage.input_tokens > 0 and msg.usage.output_tokens > 0


def test_messages_streamed_and_not_through_the_sdk(make_stub, make_proxy, client):
    proxy = make_proxy(make_stub(REPLY).url)
    c = client(proxy)
    msg = c.messages.create(**BODY)
    check_message(msg)
    with c.messages.stream(**BODY) as stream:
        final = stream.get_final_message()
    check_message(final)
    recs = calls(proxy)
    assert [(r.status, r.dialect, r.stream) for r in recs] == [
        ("ok", "anthropic", False),
        ("ok", "anthropic", True),
    ]
    for r in recs:
        # this SDK version sends the key as `Authorization`; Claude Code sends `x-api-key` (checked below)
        auth = {
            k.lower(): v for k, v in r.request_headers.items() if k.lower() in ("authorization", "x-api-key")
        }
        assert auth and set(auth.values()) == {"<redacted>"}
        assert KEY not in r.request_body


def test_beta_query_and_signature_round_trip(make_stub, make_proxy):
    proxy = make_proxy(make_stub(REPLY).url)
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    r = httpx.post(proxy.url + PATH, json=BODY, headers=headers, timeout=30)
    assert r.status_code == 200
    answer = r.json()
    follow = {
        **BODY,
        "messages": [
            *BODY["messages"],
            {"role": "assistant", "content": answer["content"]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": answer["content"][2]["id"], "content": "a"}
                ],
            },
        ],
    }
    assert httpx.post(proxy.url + PATH, json=follow, headers=headers, timeout=30).status_code == 200
    first, second = calls(proxy)
    assert "beta=true" in first.path
    assert first.request_headers["x-api-key"] == "<redacted>"
    back = second.conversation["messages"][1]
    assert back["signature"] == first.completion["signature"]
    assert back["reasoning"] == "hmm"
    assert back["tool_calls"] == first.completion["tool_calls"]


def test_malformed_request_gets_an_anthropic_400_and_a_failed_record(make_stub, make_proxy, client):
    proxy = make_proxy(make_stub().url)
    bad = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(proxy.url + PATH, json=bad, timeout=30)
    assert r.status_code == 400
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert "max_tokens is required" in err["error"]["message"]
    r = httpx.post(proxy.url + PATH, content=b"{not json", timeout=30)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    import anthropic

    with pytest.raises(anthropic.BadRequestError):
        client(proxy).messages.create(
            model="tiny",
            max_tokens=8,
            messages=[
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}
            ],
        )
    recs = calls(proxy)
    assert [(c.status, c.http_status, c.dialect) for c in recs] == [("failed", 400, "anthropic")] * 3


def test_backend_500_becomes_an_anthropic_error(make_stub, make_proxy, client):
    import anthropic

    proxy = make_proxy(make_stub(status=500).url, check_backend=False)
    r = httpx.post(proxy.url + PATH, json=BODY, timeout=30)
    assert r.status_code == 502
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"
    assert "answered 500" in r.json()["error"]["message"]
    with pytest.raises(anthropic.APIStatusError) as e, client(proxy).messages.stream(**BODY) as stream:
        stream.get_final_message()
    assert e.value.status_code == 502
    assert [(c.status, c.http_status) for c in calls(proxy)] == [("failed", 502), ("failed", 502)]


def test_backend_dying_mid_stream_sends_an_error_event(make_stub, make_proxy, client):
    import anthropic

    stub = make_stub("one two three four five six seven eight", die_after=3, per_token_ms=5)
    proxy = make_proxy(stub.url)
    with httpx.stream("POST", proxy.url + PATH, json={**BODY, "stream": True}, timeout=30) as r:
        events = SSEDecoder().decode(r.read())
    assert events[0].event == "message_start"
    assert events[-1].event == "error"
    assert orjson.loads(events[-1].data)["error"]["type"] == "api_error"
    with pytest.raises(anthropic.APIStatusError), client(proxy).messages.stream(**BODY) as stream:
        stream.get_final_message()


def test_a_slow_model_gets_ping_events(make_stub, make_proxy):
    stub = make_stub("slow words here", per_token_ms=250)
    proxy = make_proxy(stub.url, keepalive_s=0.05)
    with httpx.stream("POST", proxy.url + PATH, json={**BODY, "stream": True}, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = SSEDecoder().decode(r.read())
    names = [e.event for e in events]
    assert names.count("ping") >= 3
    assert all(orjson.loads(e.data) == {"type": "ping"} for e in events if e.event == "ping")
    assert names[-2:] == ["message_delta", "message_stop"]
    text = "".join(
        orjson.loads(e.data)["delta"]["text"]
        for e in events
        if e.event == "content_block_delta" and "text" in orjson.loads(e.data)["delta"]
    )
    assert text == "slow words here"
    (c,) = calls(proxy)
    assert c.status == "ok"
