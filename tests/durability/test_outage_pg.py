"""PostgreSQL stopped mid-run, then started again: the proxy keeps answering, the calls it completed while
the database was down wait in its spool (and `polarproxy ls` says so), and once the database is back they
are replayed in order; no completed call is lost, none is duplicated."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from pgcluster import pg_cluster_or_skip
from proc_helpers import polarproxy, wait_for

from polarproxy.sse import SSEDecoder
from polarproxy.store.store import Store

CHAT = "/v1/chat/completions"


@pytest.fixture
def cluster():
    c = pg_cluster_or_skip()
    yield c
    c.destroy()


def ask(url: str, i: int, *, stream: bool) -> str:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"question {i}"}],
        "max_tokens": 32,
        "stream": stream,
    }
    r = httpx.post(url + CHAT, json=body, timeout=60)
    assert r.status_code == 200, r.text
    if not stream:
        return str(r.json()["choices"][0]["message"]["content"])
    dec = SSEDecoder()
    events = dec.decode(r.content) + dec.flush()
    text = ""
    for ev in events:
        if ev.data and ev.data != "[DONE]":
            for choice in json.loads(ev.data).get("choices", []):
                text += choice.get("delta", {}).get("content") or ""
    return text


def spools(env: dict[str, str]) -> list[Path]:
    return sorted(Path(env["POLARPROXY_SPOOL_DIR"]).glob("*/*.spool"))


def test_postgres_stopped_mid_run_loses_no_completed_call(cluster, stub, serve, env, reply_ids):
    url = cluster.create_database("outage")
    served = serve(stub.url, url)
    for i in range(3):
        assert ask(served.url, i, stream=i % 2 == 1) == "Hello there."
    assert spools(env) == []  # the happy path never writes a spool

    cluster.stop("fast")
    for i in range(3, 7):  # the database is down: the harness is still answered
        assert ask(served.url, i, stream=i % 2 == 1) == "Hello there."
    [spool] = spools(env)

    listed = polarproxy("ls", "--db", url, env=env)
    assert listed.returncode == 1
    assert f"4 calls pending in spool {spool}" in listed.stderr
    status = polarproxy("db", "status", "--db", url, env=env)
    assert status.returncode == 1 and f"4 calls pending in spool {spool}" in status.stderr

    cluster.start()
    wait_for(
        lambda: not spool.exists(), 300, "the spool to be replayed", detail=lambda: "".join(served.stderr)
    )
    assert ask(served.url, 7, stream=False) == "Hello there."  # writing directly again

    listed = polarproxy("ls", "--json", "--db", url, env=env)
    assert listed.returncode == 0, listed.stderr
    assert "pending" not in listed.stderr
    store = Store.open(url)
    try:
        calls = store.list_calls(served.episode_id)
        assert [c.seq for c in calls] == list(range(8))
        assert [json.loads(c.request_body)["messages"][0]["content"] for c in calls] == [
            f"question {i}" for i in range(8)
        ]
        assert [c.status for c in calls] == ["ok"] * 8
        assert all(c.output_ids == reply_ids for c in calls)
        assert all(c.output_logprobs == [-0.5] * len(reply_ids) for c in calls)
        assert [c.stream for c in calls] == [i % 2 == 1 for i in range(7)] + [False]
        assert store.get_episode(served.episode_id).status == "running"
    finally:
        store.close()
    assert os.listdir(Path(env["POLARPROXY_SPOOL_DIR"]) / spool.parent.name) == ["db.txt"]


HARNESS = """
import json, os, sys, time, urllib.request
go = sys.argv[1]
def call(i):
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 32}
    req = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        assert json.loads(r.read())["choices"][0]["message"]["content"] == "Hello there."
    print("done", i, flush=True)
call(0)
while not os.path.exists(go):
    time.sleep(0.02)
call(1)
sys.exit(3)
"""


def test_record_ending_while_postgres_is_down_exits_with_the_harness_code_and_db_repair_replays(
    cluster, stub, env, tiny_model_dir, tmp_path, reply_ids
):
    import subprocess
    import sys

    url = cluster.create_database("ended")
    harness, go = tmp_path / "h.py", tmp_path / "go"
    harness.write_text(HARNESS)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "polarproxy", "record", "--backend", stub.url),
            *("--model", str(tiny_model_dir), "--db", url, "--json", "--"),
            *(sys.executable, str(harness), str(go)),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "done 0\n"
    cluster.stop("fast")
    go.touch()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3  # the harness's exit code, database or not
    assert out == "done 1\n"
    [spool] = spools(env)
    assert (
        f"1 call pending in spool {spool} (4 writes;" in err
    )  # call 1 begun and finished, the episode's end
    cluster.start()
    r = polarproxy("db", "repair", "--json", "--db", url, env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["replayed_calls"] == 1
    assert not spool.exists()
    store = Store.open(url)
    try:
        [ep] = store.list_episodes()
        assert (ep.status, ep.exit_code) == ("failed", 3)
        calls = store.list_calls(ep.id)
        assert [(c.seq, c.status) for c in calls] == [(0, "ok"), (1, "ok")]
        assert all(c.output_ids == reply_ids for c in calls)
    finally:
        store.close()


def test_with_the_database_down_serve_fails_closed_and_its_running_episodes_keep_working(
    cluster, stub, serve, env
):
    """A key that cannot be checked is refused in its dialect's shape and never forwarded; a key this proxy
    issued keeps working from memory, its calls going to the spool."""
    url = cluster.create_database("closed")
    token = "ctl-outage-token"
    served = serve(stub.url, url, "--control-token", token)
    ctl = {"authorization": f"Bearer {token}"}
    created = httpx.post(served.url + "/polarproxy/v1/episodes", json={"task": "t"}, headers=ctl, timeout=30)
    assert created.status_code == 201, created.text
    key = created.json()["api_key"]
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    ok = httpx.post(served.url + CHAT, json=body, headers={"authorization": f"Bearer {key}"}, timeout=60)
    assert ok.status_code == 200, ok.text

    cluster.stop("fast")
    reached = stub.stub.cfg.calls
    made_up = "ppk_" + "0" * 40
    refused = httpx.post(
        served.url + CHAT, json=body, headers={"authorization": f"Bearer {made_up}"}, timeout=60
    )
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "store_unavailable", refused.text
    anthropic = httpx.post(
        served.url + "/v1/messages",
        json={"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": made_up},
        timeout=60,
    )
    assert anthropic.status_code == 503 and anthropic.json()["type"] == "error"
    assert stub.stub.cfg.calls == reached  # nothing reached the backend unauthenticated
    still = httpx.post(served.url + CHAT, json=body, headers={"authorization": f"Bearer {key}"}, timeout=60)
    assert still.status_code == 200, still.text  # the running episode keeps working
    assert spools(env)  # its call waits in the spool for the database
