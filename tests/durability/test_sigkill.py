"""A proxy killed with SIGKILL mid-episode: every call the harness got a full answer to is in the store with
its tokens (T6); the call in flight is marked interrupted when the store is next opened, with why; the
episode no longer looks running. A live proxy's episode is never touched by someone else's repair."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from proc_helpers import polarproxy, wait_for

from polarproxy.store.store import Store

HARNESS = textwrap.dedent(
    """
    import json, os, sys, time, urllib.request
    progress, go = sys.argv[1], sys.argv[2]
    def note(text):
        with open(progress, "a") as f:
            f.write(text + "\\n")
    note(f"pid {os.getpid()}")
    def call(i):
        body = {"model": "tiny", "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 32}
        req = urllib.request.Request(
            os.environ["OPENAI_BASE_URL"] + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json", "authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            answer = json.loads(r.read())
        note("done %d %s" % (i, answer["choices"][0]["message"]["content"]))
    call(0)
    call(1)
    while not os.path.exists(go):
        time.sleep(0.02)
    call(2)  # the backend is slow now: the proxy is killed while this one is in flight
    """
)


def _in_flight(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT count(*) FROM calls WHERE status = 'in_flight'").fetchone()[0]


def _rows(store: Store, sql: str) -> list[tuple]:
    with store._read() as conn:
        return [tuple(r) for r in conn.exec_driver_sql(sql).all()]


@pytest.fixture(params=["sqlite", "postgresql"])
def kill_db(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "kill.db")
    return str(request.getfixturevalue("pg_server").create_database())


def test_sigkill_mid_call_keeps_completed_calls_and_marks_the_one_in_flight_interrupted(
    tmp_path, tiny_model_dir, stub, reply_ids, env, kill_db
):
    db = kill_db
    watch = Store.open(db)  # reads only: opening does not repair anything
    harness = tmp_path / "harness.py"
    harness.write_text(HARNESS)
    progress, go, log = tmp_path / "progress", tmp_path / "go", tmp_path / "record.log"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "polarproxy", "record", "--backend", stub.url),
            *("--model", str(tiny_model_dir), "--db", db, "--"),
            *(sys.executable, str(harness), str(progress), str(go)),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),  # a file, not a pipe nobody reads
        text=True,
    )
    child = None
    try:
        wait_for(
            lambda: progress.exists() and progress.read_text().count("done") == 2,
            300,
            "two answers",
            detail=log.read_text,
        )
        lines = progress.read_text().splitlines()
        child = int(lines[0].split()[1])
        assert lines[1:] == ["done 0 Hello there.", "done 1 Hello there."]
        stub.cfg.first_token_ms = 600_000  # the third call hangs at the backend
        go.touch()
        wait_for(
            lambda: stub.cfg.calls >= 3 and _rows(watch, "SELECT id FROM calls WHERE status = 'in_flight'"),
            300,
            "the third call in flight",
            detail=log.read_text,
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if child is not None:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode == -signal.SIGKILL

    # As the crash left it: the episode still says running, the third call in flight.
    assert _rows(watch, "SELECT status FROM episodes") == [("running",)]
    assert _rows(watch, "SELECT seq, status FROM calls ORDER BY seq") == [
        (0, "ok"),
        (1, "ok"),
        (2, "in_flight"),
    ]
    watch.close()

    # The next command that opens the store repairs it.
    listed = polarproxy("ls", "--json", "--db", db, env=env)
    assert listed.returncode == 0, listed.stderr
    [row] = json.loads(listed.stdout)
    assert row["status"] == "interrupted" and row["calls"] == 3

    store = Store.open(db)
    try:
        ep = store.get_episode(row["id"])
        assert ep.status == "interrupted" and ep.ended_at is not None
        calls = store.list_calls(ep.id)
        assert [(c.seq, c.status) for c in calls] == [(0, "ok"), (1, "ok"), (2, "interrupted")]
        for c in calls[:2]:  # what the harness received is stored whole
            assert c.output_ids == reply_ids
            assert c.output_logprobs == [-0.5] * len(reply_ids)
            assert c.finish_reason == "stop" and c.http_status == 200
            assert "Hello there." in (c.response_body or "")
        dead = calls[2]
        assert dead.output_ids == [] and dead.response_body is None
        assert dead.error is not None
        assert f"pid {proc.pid}" in dead.error and "is gone" in dead.error
        assert dead.prompt_ids  # the request side was on disk before the backend was asked
    finally:
        store.close()


def test_repair_leaves_a_live_proxys_episode_and_in_flight_call_alone(tmp_path, stub, serve, env):
    db = tmp_path / "live.db"
    served = serve(stub.url, str(db))
    stub.cfg.first_token_ms = 600_000
    import threading

    import httpx

    def hang() -> None:
        try:
            httpx.post(
                served.url + "/v1/chat/completions",
                json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
                timeout=60,
            )
        except httpx.HTTPError:
            pass

    t = threading.Thread(target=hang, daemon=True)
    t.start()
    wait_for(lambda: _in_flight(db) == 1, 300, "a call in flight", detail=lambda: "".join(served.stderr))
    repaired = polarproxy("db", "repair", "--json", "--db", str(db), "--stale-after", "1s", env=env)
    assert repaired.returncode == 0, repaired.stderr
    report = json.loads(repaired.stdout)
    assert report["episodes_interrupted"] == [] and report["calls_interrupted"] == 0
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT id, status FROM episodes").fetchall() == [(served.episode_id, "running")]
        assert conn.execute("SELECT status FROM calls").fetchall() == [("in_flight",)]
    served.stop()  # the proxy ends cleanly: its call is recorded as aborted, its episode as ended
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT status FROM episodes").fetchall() == [("ok",)]
        assert conn.execute("SELECT status FROM calls").fetchall() == [("aborted",)]
