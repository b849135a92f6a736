"""`polarproxy db path|status|migrate|repair`."""

from __future__ import annotations

import json
import sqlite3

from polarproxy.store import migrations as mig
from polarproxy.store import owners, spool
from polarproxy.store.records import CallResult, EpisodeStart
from polarproxy.store.store import Store


def _first_release_db(path) -> None:
    """A database as the first release left it: m001 only, with an episode and a call in it."""
    from sqlalchemy import create_engine

    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        mig.migrations_table.create(conn)
        mig.m001_initial(conn)
        conn.execute(
            mig.migrations_table.insert().values(name="m001_initial", applied_at="2026-01-01T00:00:00")
        )
    engine.dispose()
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO episodes (id, command_json, status, started_at, metadata_json, next_seq) "
            "VALUES ('ep_old000000000', '[\"agent\"]', 'ok', 1.0, '{}', 1)"
        )
        conn.execute(
            "INSERT INTO calls (id, episode_id, seq, dialect, method, path, model, stream, status, "
            "request_headers_json, request_body, prompt_tail_ids, prompt_len, output_ids, output_logprobs, "
            "backend, backend_kind, fidelity, render_mode, started_at) VALUES ('call_old0000000000000', "
            "'ep_old000000000', 0, 'openai_chat', 'POST', '/v1/chat/completions', 'm', 0, 'ok', '{}', '{}', "
            "X'', 0, X'', X'', '', '', 'tokens', 'fresh', 1.0)"
        )


def test_db_path_prints_the_file_and_hides_a_password(cli, db_path):
    r = cli("db", "path", "--db", str(db_path))
    assert r.exit_code == 0 and r.stdout.strip() == str(db_path.resolve())
    r = cli("db", "path", "--db", "postgresql://alice:s3cret@db.example:5432/runs", "--json")
    data = json.loads(r.stdout)
    assert "s3cret" not in r.stdout
    assert (
        data["url"] == "postgresql+psycopg://alice:***@db.example:5432/runs"
        and data["backend"] == "postgresql"
    )


def test_migrate_check_reports_pending_migrations_then_migrate_applies_them_keeping_rows(cli, db_path):
    _first_release_db(db_path)
    pending = [fn.__name__ for fn in mig.MIGRATIONS[1:]]
    r = cli("db", "migrate", "--check", "--db", str(db_path), "--json")
    assert r.exit_code == 1 and json.loads(r.stdout)["pending_migrations"] == pending
    r = cli("db", "status", "--db", str(db_path), "--json")
    assert r.exit_code == 0
    status = json.loads(r.stdout)
    assert status["schema"] == "m001_initial" and status["pending_migrations"] == pending
    r = cli("db", "migrate", "--db", str(db_path), "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["applied"] == pending
    r = cli("db", "migrate", "--check", "--db", str(db_path))
    assert r.exit_code == 0 and "up to date" in r.stdout
    with Store.open(db_path) as store:
        [ep] = store.list_episodes()
        assert (ep.id, ep.status, ep.calls) == ("ep_old000000000", "ok", 1)


def test_db_status_counts_by_status_and_names_stale_episodes_and_spools(cli, store, db, make_start):
    ok = store.create_episode(EpisodeStart(command=["a"]))
    cid, _ = store.begin_call(make_start(ok, [1]))
    store.finish_call(cid, CallResult(status="ok", output_ids=[2]))
    store.finish_episode(ok, status="ok")
    stale = store.create_episode(EpisodeStart(command=["b"]))
    owners.claim(store, stale, "w_vanished")  # a writer that left no row: dead
    store.begin_call(make_start(stale, [1]))
    f = spool.SpoolFile(spool.spool_dir(store.url) / "w_x.spool")
    f.append([spool.op_begin_call("call_0000000000000000", make_start(stale, [9]))])
    f.close()
    r = cli("db", "status", "--db", db, "--json")
    assert r.exit_code == 0, r.stdout
    data = json.loads(r.stdout)
    assert data["schema"] == mig.MIGRATIONS[-1].__name__ and data["pending_migrations"] == []
    assert data["episodes"] == {"ok": 1, "running": 1}
    assert data["calls"] == {"in_flight": 1, "ok": 1}
    assert [s["id"] for s in data["stale_running_episodes"]] == [stale]
    assert [(b["calls"], b["live"]) for b in data["spool"]] == [(1, False)]
    text = cli("db", "status", "--db", db).stdout
    assert f"stale: episode {stale} is running" in text
    assert "1 call pending in spool" in text and "run `polarproxy db repair`" in text


def test_db_repair_replays_and_interrupts_and_says_what_it_did(cli, store, db, make_start):
    stale = store.create_episode(EpisodeStart(command=["b"]))
    owners.claim(store, stale, "w_vanished")
    flying, _ = store.begin_call(make_start(stale, [1]))
    r = cli("db", "repair", "--db", db, "--json")
    assert r.exit_code == 0
    report = json.loads(r.stdout)
    assert report["calls_interrupted"] == 1
    assert [e["episode_id"] for e in report["episodes_interrupted"]] == [stale]
    assert store.get_call(flying).status == "interrupted"
    r = cli("db", "repair", "--db", db)
    assert "0 in-flight calls marked interrupted" in r.stdout


def test_bad_stale_after_names_the_value_and_the_units(cli, db_path):
    r = cli("db", "repair", "--db", str(db_path), "--stale-after", "ten")
    assert r.exit_code == 2
    assert "Bad age 'ten'" in r.stderr and "s, min, h, d or w" in r.stderr
