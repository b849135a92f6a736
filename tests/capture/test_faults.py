"""Bad input and failing parts: the harness gets a provider-shaped error, the proxy keeps serving, and the
record says what happened."""

from __future__ import annotations

import contextlib
import socket
import time
from contextlib import contextmanager

import httpx
import orjson
import pytest
from factories import free_port

from polarproxy.sse import SSEDecoder

CHAT = "/v1/chat/completions"
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}


def calls(proxy):
    return proxy.store.list_calls(proxy.episode_id)


def wait_for(pred, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_malformed_json_gets_a_400_and_a_failed_record_and_the_proxy_keeps_serving(make_stub, make_proxy):
    proxy = make_proxy(make_stub().url)
    r = httpx.post(proxy.url + CHAT, content=b"{not json", timeout=30)
    assert r.status_code == 400
    assert "not valid JSON" in r.json()["error"]["message"]
    ok = httpx.post(proxy.url + CHAT, json=BODY, timeout=30)
    assert ok.status_code == 200
    recs = calls(proxy)
    assert [c.status for c in recs] == ["failed", "ok"]
    assert recs[0].http_status == 400 and "not valid JSON" in recs[0].error
    assert recs[0].request_body == "{not json"  # the bad input is kept, so nothing is lost


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_body_of_invalid_utf8_and_nul_bytes_gets_a_400_and_a_failed_record(
    make_stub, make_proxy, request, backend
):
    # PostgreSQL's text columns cannot hold NUL: such a call was lost there (the store refused the write)
    db = {} if backend == "sqlite" else {"db": request.getfixturevalue("pg_server").create_database()}
    proxy = make_proxy(make_stub().url, **db)
    raw = b'{"model": "tiny", \x00 "x": "\xff\xfe"'
    r = httpx.post(proxy.url + CHAT, content=raw, timeout=30)
    assert r.status_code == 400
    assert "not valid JSON" in r.json()["error"]["message"]
    ok = httpx.post(proxy.url + CHAT, json=BODY, timeout=30)
    assert ok.status_code == 200
    recs = calls(proxy)
    assert [c.status for c in recs] == ["failed", "ok"]
    assert recs[0].http_status == 400 and "not valid JSON" in recs[0].error
    kept = "\x00" if backend == "sqlite" else "\ufffd"  # SQLite keeps the NUL; PostgreSQL cannot
    assert recs[0].request_body.startswith(f'{{"model": "tiny", {kept} "x": ')


def test_invalid_request_names_the_bad_value(make_stub, make_proxy):
    proxy = make_proxy(make_stub().url)
    r = httpx.post(proxy.url + CHAT, json={"messages": [{"role": "wizard", "content": "x"}]}, timeout=30)
    assert r.status_code == 400
    assert "Unknown role 'wizard'" in r.json()["error"]["message"]
    assert calls(proxy)[0].status == "failed"


def test_unknown_route_gets_a_provider_shaped_404_and_no_record(make_stub, make_proxy):
    proxy = make_proxy(make_stub().url)
    r = httpx.post(proxy.url + "/v1/embeddings", json={}, timeout=30)
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "unknown_route"
    assert calls(proxy) == []


def test_backend_500_becomes_an_openai_error_and_a_failed_record(make_stub, make_proxy):
    proxy = make_proxy(make_stub(status=500).url, check_backend=False)
    for stream in (False, True):
        r = httpx.post(proxy.url + CHAT, json={**BODY, "stream": stream}, timeout=30)
        assert r.status_code == 502
        err = r.json()["error"]
        assert "answered 500" in err["message"] and err["code"] == "backend_error"
    assert [(c.status, c.http_status) for c in calls(proxy)] == [("failed", 502), ("failed", 502)]
    assert all("backend_error" in c.error for c in calls(proxy))


def test_unreachable_backend_becomes_a_503_and_a_failed_record(make_proxy):
    proxy = make_proxy(f"http://127.0.0.1:{free_port()}", check_backend=False)
    r = httpx.post(proxy.url + CHAT, json=BODY, timeout=30)
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "backend_unreachable"
    (c,) = calls(proxy)
    assert c.status == "failed" and c.error.startswith("backend_unreachable")
    assert c.prompt_ids, "the prompt that would have been sent is still recorded"


def test_backend_dying_mid_stream_ends_the_stream_with_an_error_event_and_keeps_the_partial_tokens(
    make_stub, make_proxy
):
    stub = make_stub("one two three four five six seven eight", die_after=3, per_token_ms=5)
    proxy = make_proxy(stub.url)
    with httpx.stream("POST", proxy.url + CHAT, json={**BODY, "stream": True}, timeout=30) as r:
        assert r.status_code == 200
        events = SSEDecoder().decode(r.read())
    last = orjson.loads(events[-1].data)
    assert "error" in last and last["error"]["code"] == "backend_disconnected"
    (c,) = calls(proxy)
    assert c.status == "failed" and c.error.startswith("backend_disconnected")
    assert c.output_ids == stub.cfg.output_ids[:3]
    assert c.output_logprobs == [stub.cfg.logprob] * 3
    # still serving
    stub.cfg.die_after = None
    assert httpx.post(proxy.url + CHAT, json=BODY, timeout=30).status_code == 200


@contextmanager
def answer_under_way(make_stub, make_proxy):
    """A proxy, and a 4 s streamed answer through it of which two chunks have arrived (the rest's iterator)."""
    proxy = make_proxy(make_stub(" ".join(["word"] * 200), per_token_ms=20).url)
    with httpx.stream("POST", proxy.url + CHAT, json={**BODY, "stream": True}, timeout=30) as r:
        it = r.iter_raw()
        next(it)
        next(it)
        yield proxy, it


def test_client_hanging_up_mid_stream_is_recorded_as_aborted(make_stub, make_proxy):
    with answer_under_way(make_stub, make_proxy) as (proxy, _):
        pass  # the harness hangs up
    assert wait_for(lambda: calls(proxy) and calls(proxy)[0].status != "in_flight")
    (c,) = calls(proxy)
    assert c.status == "aborted" and "disconnected" in c.error
    assert httpx.post(proxy.url + CHAT, json=BODY, timeout=30).status_code == 200


def test_the_proxy_stopping_mid_stream_is_recorded_as_such_not_as_a_hang_up(make_stub, make_proxy):
    with answer_under_way(make_stub, make_proxy) as (proxy, it):
        proxy.stop()
        with pytest.raises(httpx.HTTPError):  # the stream ends unfinished
            for _ in it:
                pass
    (c,) = calls(proxy)
    assert c.status == "aborted" and c.error == "aborted: the proxy stopped before the answer was complete"


@contextmanager
def head_held(make_stub, make_proxy):
    """A proxy, and a raw harness connection whose streamed call waits for a first token 4 s away, its
    head given to mitmproxy ahead and held by the hook (capture/inprocess.py)."""
    proxy = make_proxy(make_stub("one two three", first_token_ms=4000).url)
    host, port = proxy.url.removeprefix("http://").split(":")
    body = orjson.dumps({**BODY, "stream": True})
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(
            b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (CHAT.encode(), len(body), body)
        )
        assert wait_for(lambda: calls(proxy))  # in flight: the backend computes the first token
        time.sleep(0.3)  # the head's hook holds it by now
        yield proxy, s


def test_a_harness_hanging_up_while_its_streams_head_is_held_is_recorded_as_aborted_at_once(
    make_stub, make_proxy
):
    """The hook that holds a head given ahead looks at the harness's connection: a hang-up before the
    first token ends the call then, not when the backend answers."""
    with head_held(make_stub, make_proxy) as (proxy, _):
        pass  # the harness hangs up
    hung_up = time.monotonic()
    assert wait_for(lambda: calls(proxy)[0].status != "in_flight", timeout=10)
    assert time.monotonic() - hung_up < 3.0  # well before the first token (4 s after the request)
    (c,) = calls(proxy)
    assert c.status == "aborted" and "disconnected" in c.error
    assert proxy.proxy.recorder.responder.held == {}
    assert wait_for(lambda: not proxy.proxy.recorder.responder.running)


def test_the_proxy_stopping_while_a_streams_head_is_held_sends_no_head_and_records_the_stop(
    make_stub, make_proxy
):
    """An answer that ends without a head (here: the proxy stops before the first token) while its hook
    holds the head given ahead: the harness gets mitmproxy's 502 with the reason, as when no head was
    given ahead, never the 200 that was held."""
    with head_held(make_stub, make_proxy) as (proxy, s):
        proxy.stop()
        received = b""
        with contextlib.suppress(OSError):
            while chunk := s.recv(65536):
                received += chunk
    assert received.startswith(b"HTTP/1.1 502") and b"stopped serving this answer" in received
    (c,) = calls(proxy)
    assert c.status == "aborted" and c.error == "aborted: the proxy stopped before the answer was complete"


def test_client_hanging_up_during_a_non_streamed_call_is_recorded_as_aborted(make_stub, make_proxy):
    # the answer is made inside the addon's request hook (no hop): the hang-up is seen while it waits
    stub = make_stub(" ".join(["word"] * 200), per_token_ms=20)
    proxy = make_proxy(stub.url)
    with socket.create_connection(("127.0.0.1", int(proxy.url.rsplit(":", 1)[1]))) as s:
        body = orjson.dumps({**BODY, "max_tokens": 200})
        s.sendall(
            b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (CHAT.encode(), len(body), body)
        )
        assert wait_for(lambda: bool(calls(proxy)))  # in flight: the backend is generating
    assert wait_for(lambda: calls(proxy)[0].status != "in_flight")
    (c,) = calls(proxy)
    # aborted, not ok: the hang-up was seen before the 4 s answer was done (no timing is asserted)
    assert c.status == "aborted" and "disconnected" in c.error
    assert httpx.post(proxy.url + CHAT, json=BODY, timeout=30).status_code == 200


def test_no_secret_reaches_the_database(make_stub, make_proxy, tmp_path):
    proxy = make_proxy(make_stub().url)
    secret = "sk-live-SECRET-1234567890"
    headers = {
        "authorization": f"Bearer {secret}",
        "x-api-key": secret,
        "x-goog-api-key": secret,
        "api-key": secret,
        "cookie": f"session={secret}",
    }
    r = httpx.post(proxy.url + CHAT + f"?key={secret}", json=BODY, headers=headers, timeout=30)
    assert r.status_code == 200
    bad = httpx.post(proxy.url + CHAT, content=b"{", headers=headers, timeout=30)
    assert bad.status_code == 400
    proxy.stop()
    for f in tmp_path.glob("p0.db*"):
        assert secret.encode() not in f.read_bytes(), f
    (c, _) = calls(proxy)
    assert c.request_headers["authorization"] == "<redacted>"
    assert "SECRET" not in c.path


def test_a_slow_model_gets_keepalive_comments_between_tokens(make_stub, make_proxy):
    stub = make_stub("slow words here", per_token_ms=250)
    proxy = make_proxy(stub.url, keepalive_s=0.05)
    with httpx.stream("POST", proxy.url + CHAT, json={**BODY, "stream": True}, timeout=30) as r:
        raw = r.read()
    assert raw.count(b": keep-alive\n\n") >= 3
    events = SSEDecoder().decode(raw)
    assert events[-1].data == "[DONE]"  # comments are invisible to SSE clients
    (c,) = calls(proxy)
    assert c.status == "ok"


def test_an_unwritable_store_refuses_to_serve_and_says_why(make_stub, make_proxy, tmp_path):
    import sqlite3

    proxy = make_proxy(make_stub().url)
    assert httpx.post(proxy.url + CHAT, json=BODY, timeout=30).status_code == 200
    db = sqlite3.connect(tmp_path / "p0.db")
    db.execute("DROP TABLE calls")  # the store breaks under the running proxy
    db.commit()
    db.close()
    for stream in (False, True):
        r = httpx.post(proxy.url + CHAT, json={**BODY, "stream": stream}, timeout=30)
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "store_unavailable"


def test_tokens_reach_the_harness_while_the_backend_is_still_generating(make_stub, make_proxy):
    stub = make_stub("one two three four five six seven eight nine ten", per_token_ms=150)
    proxy = make_proxy(stub.url)
    seen: list[tuple[float, str]] = []
    dec = SSEDecoder()
    with httpx.stream("POST", proxy.url + CHAT, json={**BODY, "stream": True}, timeout=30) as r:
        for chunk in r.iter_raw():
            for ev in dec.decode(chunk):
                seen.append((time.monotonic(), ev.data))
    contents = [t for t, data in seen if '"content":"' in data and '"content":""' not in data]
    done_at = seen[-1][0]
    assert len(contents) >= 5  # one delta per token or so, not one blob at the end
    assert (
        done_at - contents[0] > 0.8
    )  # the first words arrived about 1.5 s before the last token was sampled


def test_the_real_backend_process_killed_mid_stream(random_model_dir, make_backend, make_proxy):
    backend = make_backend(random_model_dir)
    proxy = make_proxy(backend.url)
    body = {**BODY, "stream": True, "max_tokens": 4000, "temperature": 1.0, "seed": 1}
    got = b""
    with httpx.stream("POST", proxy.url + CHAT, json=body, timeout=60) as r:
        it = r.iter_raw()
        while got.count(b"data: ") < 5:
            got += next(it)
        backend.kill()  # SIGKILL, mid-answer
        for chunk in it:
            got += chunk
    last = orjson.loads(SSEDecoder().decode(got)[-1].data)
    assert last["error"]["code"] == "backend_disconnected"
    (c,) = calls(proxy)
    assert c.status == "failed" and c.error.startswith("backend_disconnected")
    assert 0 < len(c.output_ids) == len(c.output_logprobs) < 4000
    r2 = httpx.post(proxy.url + CHAT, json=BODY, timeout=30)  # still serving: a clean error now
    assert r2.status_code == 503 and r2.json()["error"]["code"] == "backend_unreachable"


def test_t6_the_call_is_on_disk_before_the_finish_chunk_reaches_the_harness(make_stub, make_proxy, tmp_path):
    import sqlite3

    proxy = make_proxy(make_stub("one two three", per_token_ms=20).url)
    seen_in_flight = False
    with httpx.stream("POST", proxy.url + CHAT, json={**BODY, "stream": True}, timeout=30) as r:
        dec = SSEDecoder()
        for chunk in r.iter_raw():
            for ev in dec.decode(chunk):
                db = sqlite3.connect(tmp_path / "p0.db")  # another connection: only committed rows show
                (status,) = db.execute("SELECT status FROM calls").fetchone()
                db.close()
                data = orjson.loads(ev.data) if ev.data != "[DONE]" else {}
                finished = any(c.get("finish_reason") for c in data.get("choices", []))
                if finished or ev.data == "[DONE]":
                    assert status == "ok"  # committed before the finish chunk was sent
                elif status == "in_flight":
                    seen_in_flight = True  # and the in-flight row was on disk before the first byte
    assert seen_in_flight


def test_t6_a_non_streamed_answer_comes_only_after_its_call_is_committed(make_stub, make_proxy, tmp_path):
    # answered from the addon's hook (no hop): the whole body goes out after the finished record
    import sqlite3

    proxy = make_proxy(make_stub("one two three", per_token_ms=20).url)
    for _ in range(3):
        r = httpx.post(proxy.url + CHAT, json=BODY, timeout=30)
        assert r.status_code == 200
        db = sqlite3.connect(tmp_path / "p0.db")  # another connection: only committed rows show
        statuses = [s for (s,) in db.execute("SELECT status FROM calls")]
        db.close()
        assert statuses and all(s == "ok" for s in statuses), statuses


def test_the_proxy_loads_only_the_mitmproxy_addons_it_runs(make_stub, make_proxy):
    """capture/mitm.py skips mitmproxy/addons/__init__.py (it imports ~30 default addons and ldap3):
    a proxy started in a fresh process serves a call without them."""
    import subprocess
    import sys

    stub = make_stub()
    code = f"""
import asyncio, sys, httpx
from polarproxy.capture.mitm import start_mitm
class Answer:
    def request(self, flow):
        from mitmproxy import http
        flow.response = http.Response.make(200, b"ok")
async def main():
    m = await start_mitm(Answer(), {{"mode": ["reverse:{stub.url}"]}}, host="127.0.0.1", port=0)
    async with httpx.AsyncClient(trust_env=False) as c:
        r = await c.get(m.url + "/x")
    await m.stop()
    print(r.status_code, sorted(k for k in sys.modules if k.startswith("mitmproxy.addons.")), "ldap3" in sys.modules)
asyncio.run(main())
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    status, rest = r.stdout.split(" ", 1)
    assert status == "200"
    assert "proxyauth" not in rest and rest.strip().endswith("False"), rest
