"""A full disk under a SQLite store (a small tmpfs of our own):

- the database's disk is full but the spool's is not: calls are answered, spooled, and replayed into the
  database once there is room again;
- both are full: the harness gets a provider-shaped 503 that names the cause, nothing is served
  unrecorded, and the proxy goes on serving (and recording) once there is room.

(A file system turned read-only under a running proxy is not tested: Linux refuses to remount it while the
database is open for writing, and an open file stays writable through a read-only bind mount.)
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from proc_helpers import polarproxy, wait_for

CHAT = "/v1/chat/completions"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted for this test (needs root, as in CI)."""
    where = tmp_path / "disk"
    where.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True, text=True
    )
    if r.returncode != 0:
        if os.environ.get("CI"):
            raise RuntimeError(f"cannot mount a tmpfs in CI: {r.stderr.strip()}")
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def fill(disk: Path) -> Path:
    """Fill the disk to the last byte; return the filler file (delete it to make room)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 16, 1 << 12, 1 << 9, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return filler


def ask(url: str, i: int) -> httpx.Response:
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 32}
    return httpx.post(url + CHAT, json=body, timeout=60)


def rows(db: Path) -> list[tuple[int, str, str]]:
    with sqlite3.connect(db) as conn:
        return [
            (seq, status, json.loads(body)["messages"][0]["content"])
            for seq, status, body in conn.execute("SELECT seq, status, request_body FROM calls ORDER BY seq")
        ]


def spool_files(env: dict[str, str]) -> list[Path]:
    return sorted(Path(env["POLARPROXY_SPOOL_DIR"]).glob("*/*.spool"))


def test_full_database_disk_spools_calls_and_replays_them_when_there_is_room(
    small_disk, stub, serve, env, reply_ids
):
    db = small_disk / "store.db"
    served = serve(stub.url, str(db))
    assert ask(served.url, 0).status_code == 200
    filler = fill(small_disk)
    for i in (1, 2):
        r = ask(served.url, i)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"] == "Hello there."
    [spool] = spool_files(env)
    assert rows(db) == [(0, "ok", "question 0")]
    listed = polarproxy("ls", "--db", str(db), env=env)
    assert listed.returncode == 0, listed.stderr
    assert f"2 calls pending in spool {spool}" in listed.stderr

    filler.unlink()
    wait_for(
        lambda: not spool.exists(), 300, "the spool to be replayed", detail=lambda: "".join(served.stderr)
    )
    assert rows(db) == [(0, "ok", "question 0"), (1, "ok", "question 1"), (2, "ok", "question 2")]
    with sqlite3.connect(db) as conn:
        blobs = conn.execute("SELECT output_ids FROM calls").fetchall()
    assert len({b for (b,) in blobs}) == 1  # the same sampled tokens in every call
    from polarproxy.store.store import Store

    with contextlib.closing(Store.open(db)) as store:
        assert all(c.output_ids == reply_ids for c in store.list_calls(served.episode_id))


def test_full_disk_for_database_and_spool_answers_503_naming_the_cause_and_keeps_serving(
    small_disk, stub, serve, env
):
    db = small_disk / "store.db"
    env["POLARPROXY_SPOOL_DIR"] = str(small_disk / "spool")  # the spool is on the full disk too
    served = serve(stub.url, str(db))
    assert ask(served.url, 0).status_code == 200
    calls_before = stub.cfg.calls
    filler = fill(small_disk)

    r = ask(served.url, 1)
    assert r.status_code == 503
    err = r.json()["error"]
    assert err["code"] == "store_unavailable"
    assert "database or disk is full" in err["message"]  # the database's reason
    assert "No space left on device" in err["message"]  # and the spool's
    assert "will not serve unrecorded calls" in err["message"]
    assert stub.cfg.calls - calls_before <= 1  # at most started at the backend, never answered
    assert served.proc.poll() is None

    filler.unlink()
    r = ask(served.url, 2)
    assert r.status_code == 200, r.text
    wait_for(
        lambda: len(rows(db)) == 2 and not spool_files(env),
        300,
        "the call to reach the database",
        detail=lambda: "".join(served.stderr),
    )
    assert rows(db) == [(0, "ok", "question 0"), (1, "ok", "question 2")]  # nothing for the refused call


def test_record_on_a_full_disk_exits_with_the_harness_code_and_no_traceback(
    small_disk, stub, env, tiny_model_dir
):
    """The store's disk fills while `record`'s harness runs (the spool's too): the harness's call is refused
    in its own shape, and `record` still exits with the harness's code, says `Error:` with the reason, and
    prints no traceback."""
    import sys

    db = small_disk / "store.db"
    env["POLARPROXY_SPOOL_DIR"] = str(small_disk / "spool")
    trigger = small_disk.parent / "fill-now"
    harness = (
        "import os, sys, time, httpx; "
        f"open({str(trigger)!r}, 'w').close(); "
        f"[time.sleep(0.05) for _ in range(200) if not os.path.exists({str(trigger) + '.done'!r})]; "
        "r = httpx.post(os.environ['OPENAI_BASE_URL'] + '/chat/completions', json={'model': 'm', "
        "'messages': [{'role': 'user', 'content': 'hi'}], 'max_tokens': 8}, timeout=60); "
        "print(r.status_code, flush=True); sys.exit(3)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "polarproxy", "record", "--backend", stub.url, "--model", str(tiny_model_dir),
         "--db", str(db), "--", sys.executable, "-c", harness],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    wait_for(lambda: trigger.exists() or proc.poll() is not None, 120, "the harness to start")
    filler = fill(small_disk)
    Path(str(trigger) + ".done").touch()
    out, err = proc.communicate(timeout=120)
    filler.unlink()
    assert out.strip() == "503", (out, err[-2000:])
    assert proc.returncode == 3, err[-2000:]
    assert "Traceback" not in err and "Error:" in err, err[-2000:]
