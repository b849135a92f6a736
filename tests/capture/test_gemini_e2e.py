"""Gemini through the real proxy, read by the real Google GenAI SDK."""

from __future__ import annotations

import json

import httpx
import pytest

from polarproxy.dialects.base import answer_signature
from polarproxy.sse import SSEDecoder

pytestmark = pytest.mark.integration

REPLY = (
    '<think>\nhmm\n</think>\n\nHello <tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n</tool_call>'
)
MODEL = "gemini-test"
UNARY = f"/v1beta/models/{MODEL}:generateContent"
STREAM = f"/v1beta/models/{MODEL}:streamGenerateContent"
BODY = {
    "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
    "generationConfig": {"maxOutputTokens": 64},
}


def calls(proxy):
    return proxy.store.list_calls(proxy.episode_id)


@pytest.fixture
def client():
    """client(proxy) -> a google.genai.Client on the proxy, held (the SDK closes its HTTP client when the
    Client is collected) and closed at teardown, before the proxy stops."""
    from google import genai
    from google.genai import types

    made = []

    def make(proxy):
        made.append(genai.Client(api_key="k", http_options=types.HttpOptions(base_url=proxy.url)))
        return made[-1]

    yield make
    for c in made:
        c.close()


def config():
    from google.genai import types

    ls = types.FunctionDeclaration(
        name="ls",
        description="List a directory.",
        parameters_json_schema={"type": "object", "properties": {"path": {"type": "string"}}},
    )
    return types.GenerateContentConfig(
        system_instruction="You are terse.",
        tools=[types.Tool(function_declarations=[ls])],
        max_output_tokens=64,
        temperature=0.0,
    )


def test_sdk_non_streamed_and_streamed_calls_with_tools_and_the_signature_round_trip(
    make_stub, make_proxy, client
):
    from google.genai import types

    proxy = make_proxy(make_stub(REPLY).url)
    c = client(proxy)
    r = c.models.generate_content(model=MODEL, contents="List the files.", config=config())
    assert r.text == "Hello"
    (fc,) = r.function_calls
    assert fc.name == "ls" and fc.args == {"path": "."} and fc.id
    parts = r.candidates[0].content.parts
    assert parts[0].thought and parts[0].text == "hmm"
    assert parts[1].thought_signature == answer_signature(r.response_id).encode()
    assert r.candidates[0].finish_reason == types.FinishReason.STOP
    assert r.usage_metadata.candidates_token_count > 0

    chunks = list(c.models.generate_content_stream(model=MODEL, contents="List the files.", config=config()))
    text = "".join(
        p.text for ch in chunks for p in ch.candidates[0].content.parts if p.text and not p.thought
    )
    assert text == "Hello"
    streamed_calls = [fc for ch in chunks for fc in ch.function_calls or []]
    assert [(f.name, f.args) for f in streamed_calls] == [("ls", {"path": "."})]
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert chunks[-1].usage_metadata.total_token_count > 0

    # The answer goes back as history, as a harness would send it: its signature is recognised as ours.
    model_turn = types.Content(
        role="model", parts=[p for p in r.candidates[0].content.parts if not p.thought]
    )
    reply = types.Content(
        role="user",
        parts=[types.Part.from_function_response(name="ls", response={"output": "a.txt"})],
    )
    history = [types.Content(role="user", parts=[types.Part(text="List the files.")]), model_turn, reply]
    c.models.generate_content(model=MODEL, contents=history, config=config())

    recs = calls(proxy)
    assert [(x.status, x.dialect, x.stream) for x in recs] == [
        ("ok", "gemini", False),
        ("ok", "gemini", True),
        ("ok", "gemini", False),
    ]
    assert all(x.model == MODEL for x in recs)
    assert all(x.request_headers["x-goog-api-key"] == "<redacted>" for x in recs)
    assert recs[1].path.endswith(":streamGenerateContent?alt=sse")
    msgs = recs[2].conversation["messages"]
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool"]
    assert msgs[2]["signature"] == answer_signature(r.response_id)
    assert msgs[2]["tool_calls"][0]["id"] == fc.id == msgs[3]["tool_call_id"]
    assert msgs[3]["content"] == "a.txt"


def test_key_in_the_query_is_not_stored_and_a_json_array_stream_survives_keepalives(make_stub, make_proxy):
    stub = make_stub("slow words here", per_token_ms=200)
    proxy = make_proxy(stub.url, keepalive_s=0.05)
    r = httpx.post(proxy.url + UNARY + "?key=SECRET", json=BODY, timeout=30)
    assert r.status_code == 200
    assert r.json()["candidates"][0]["content"]["parts"][0]["text"] == "slow words here"
    with httpx.stream("POST", proxy.url + STREAM + "?key=SECRET", json=BODY, timeout=30) as s:
        assert s.headers["content-type"].startswith("application/json")
        raw = s.read()
    assert b"\n\n" in raw  # keep-alives (newlines) went out between the elements
    arr = json.loads(raw)
    text = "".join(p.get("text", "") for o in arr for p in o["candidates"][0]["content"]["parts"])
    assert text == "slow words here"
    assert arr[-1]["candidates"][0]["finishReason"] == "STOP"
    recs = calls(proxy)
    assert [x.status for x in recs] == ["ok", "ok"]
    assert all("SECRET" not in x.path and "key=" in x.path for x in recs)


def test_malformed_requests_get_a_gemini_shaped_400_and_a_failed_record(make_stub, make_proxy, client):
    from google.genai import errors, types

    proxy = make_proxy(make_stub().url)
    r = httpx.post(proxy.url + UNARY, content=b"{not json", timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == 400 and err["status"] == "INVALID_ARGUMENT" and "not valid JSON" in err["message"]
    image = types.Part.from_bytes(data=b"\x89PNG", mime_type="image/png")
    c = client(proxy)
    with pytest.raises(errors.ClientError) as e:
        c.models.generate_content(model=MODEL, contents=[image])
    assert e.value.code == 400 and e.value.status == "INVALID_ARGUMENT"
    assert "'inlineData'" in e.value.message
    recs = calls(proxy)
    assert [(x.status, x.http_status, x.dialect) for x in recs] == [("failed", 400, "gemini")] * 2
    assert "bad request" in recs[1].error


def test_backend_failures_become_gemini_shaped_errors(make_stub, make_proxy, client):
    from google.genai import errors

    proxy = make_proxy(make_stub(status=500).url, check_backend=False)
    for path in (UNARY, STREAM + "?alt=sse"):
        r = httpx.post(proxy.url + path, json=BODY, timeout=30)
        assert r.status_code == 502
        err = r.json()["error"]
        assert err["code"] == 502 and err["status"] == "UNAVAILABLE" and "answered 500" in err["message"]
    c = client(proxy)
    with pytest.raises(errors.ServerError) as e:
        c.models.generate_content(model=MODEL, contents="hi")
    assert e.value.code == 502
    assert [(x.status, x.http_status) for x in calls(proxy)] == [("failed", 502)] * 3


def test_backend_dying_mid_stream_ends_the_sse_stream_with_an_error_chunk(make_stub, make_proxy):
    stub = make_stub("one two three four five six seven eight", die_after=3, per_token_ms=5)
    proxy = make_proxy(stub.url)
    with httpx.stream("POST", proxy.url + STREAM + "?alt=sse", json=BODY, timeout=30) as r:
        assert r.status_code == 200
        events = SSEDecoder().decode(r.read())
    last = json.loads(events[-1].data)
    assert last["error"]["status"] == "INTERNAL" and last["error"]["details"][0]["reason"] == (
        "backend_disconnected"
    )
    (c,) = calls(proxy)
    assert c.status == "failed" and c.dialect == "gemini"
