"""OpenAI Responses through the real proxy, read by the real `openai` SDK."""

from __future__ import annotations

import httpx
import orjson
import pytest

from polarproxy.sse import SSEDecoder

pytestmark = pytest.mark.integration

PATH = "/v1/responses"
REPLY = (
    '<think>\nhmm\n</think>\n\nHello <tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>'
)
TOOLS = [
    {
        "type": "function",
        "name": "ls",
        "description": "List a directory.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        "strict": False,
    },
    {"type": "web_search"},
]
BODY = {"model": "tiny", "input": "hi", "tools": TOOLS, "max_output_tokens": 64}
KEY = "sk-SECRET-responses-123"


def calls(proxy):
    return proxy.store.list_calls(proxy.episode_id)


@pytest.fixture
def client(make_proxy):
    """client(proxy) -> the real `openai` client; closed at teardown, before the proxy stops."""
    import openai

    made = []

    def make(proxy):
        made.append(openai.OpenAI(base_url=proxy.url + "/v1", api_key=KEY, max_retries=0))
        return made[-1]

    yield make
    for c in made:
        c.close()


def check_response(r) -> None:
    assert r.status == "completed"
    assert [o.type for o in r.output] == ["reasoning", "message", "function_call"]
    reasoning, _, call = r.output
    assert reasoning.summary[0].text == "hmm"
    assert reasoning.encrypted_content == "polarproxy:" + r.id.removeprefix("resp_")
    assert r.output_text == "Hello"
    assert call.name == "ls" and orjson.loads(call.arguments) == {"path": "."}
    assert call.call_id.startswith("call_") and call.status == "completed"
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0


def test_responses_streamed_and_not_through_the_sdk(make_stub, make_proxy, client):
    proxy = make_proxy(make_stub(REPLY).url)
    c = client(proxy)
    check_response(c.responses.create(**BODY))
    with c.responses.stream(**BODY) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == "Hello"
    check_response(final)
    events = list(c.responses.create(**BODY, stream=True))
    assert events[-1].type == "response.completed"
    check_response(events[-1].response)
    seqs = [e.sequence_number for e in events]
    assert seqs == sorted(set(seqs))
    recs = calls(proxy)
    assert [(r.status, r.dialect, r.stream) for r in recs] == [
        ("ok", "openai_responses", False),
        ("ok", "openai_responses", True),
        ("ok", "openai_responses", True),
    ]
    for r in recs:
        assert r.request_headers["authorization"] == "<redacted>"
        assert KEY not in r.request_body
        assert r.completion["tool_calls"][0]["name"] == "ls"


def test_the_answer_sent_back_keeps_its_signature(make_stub, make_proxy, client):
    proxy = make_proxy(make_stub(REPLY).url)
    c = client(proxy)
    first = c.responses.create(**BODY)
    call = first.output[2]
    back = [
        {"role": "user", "content": "hi"},
        *[o.model_dump(exclude_none=True) for o in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"},
    ]
    c.responses.create(**{**BODY, "input": back})
    second = calls(proxy)[1]
    assert second.status == "ok"
    assistant = second.conversation["messages"][1]
    assert assistant["signature"] == first.output[0].encrypted_content
    assert assistant["reasoning"] == "hmm" and assistant["content"] == "Hello"
    assert assistant["tool_calls"] == [{"id": call.call_id, "name": "ls", "arguments": call.arguments}]
    assert second.conversation["messages"][2]["tool_call_id"] == call.call_id


def test_malformed_request_gets_an_openai_400_and_a_failed_record(make_stub, make_proxy, client):
    import openai

    proxy = make_proxy(make_stub(REPLY).url)
    with pytest.raises(openai.BadRequestError) as e:
        client(proxy).responses.create(model="tiny", input="hi", previous_response_id="resp_1")
    err = e.value.body
    assert "no server-side state" in err["message"] and err["type"] == "invalid_request_error"
    r = httpx.post(proxy.url + PATH, json={"input": [{"role": "wizard", "content": "x"}]}, timeout=30)
    assert r.status_code == 400
    assert "Unknown role 'wizard'" in r.json()["error"]["message"] and r.json()["error"]["param"] is None
    recs = calls(proxy)
    assert [(c.status, c.http_status) for c in recs] == [("failed", 400), ("failed", 400)]


def test_backend_500_becomes_an_openai_error(make_stub, make_proxy, client):
    import openai

    proxy = make_proxy(make_stub(status=500).url, check_backend=False)
    c = client(proxy)
    with pytest.raises(openai.APIStatusError) as e:
        c.responses.create(**BODY)
    assert e.value.status_code == 502 and e.value.body["code"] == "backend_error"
    with pytest.raises(openai.APIStatusError) as e:
        c.responses.create(**BODY, stream=True)
    assert e.value.status_code == 502
    assert [(r.status, r.http_status) for r in calls(proxy)] == [("failed", 502), ("failed", 502)]


def test_backend_dying_mid_stream_ends_with_error_and_failed_events(make_stub, make_proxy):
    proxy = make_proxy(make_stub("one two three four five six", die_after=3).url)
    with httpx.stream("POST", proxy.url + PATH, json={**BODY, "stream": True}, timeout=30) as r:
        raw = r.read()
    events = SSEDecoder().decode(raw)
    assert [e.event for e in events[-2:]] == ["error", "response.failed"]
    seqs = [orjson.loads(e.data)["sequence_number"] for e in events]
    assert seqs == list(range(len(events)))
    (rec,) = calls(proxy)
    assert rec.status == "failed"
    assert rec.response_body == raw.decode()  # the record holds exactly what the harness got


def test_keepalive_comments_while_the_model_is_slow(make_stub, make_proxy):
    proxy = make_proxy(make_stub("slow words here", per_token_ms=250).url, keepalive_s=0.05)
    with httpx.stream("POST", proxy.url + PATH, json={**BODY, "stream": True}, timeout=30) as r:
        raw = r.read()
    assert raw.count(b": keep-alive\n\n") >= 3
    events = SSEDecoder().decode(raw)
    assert events[-1].event == "response.completed"
    assert orjson.loads(events[-1].data)["response"]["output"][0]["content"][0]["text"] == "slow words here"
