"""Migrations on both backends: a blank database, reopening, an upgrade from the first released schema
(m001) with rows in it, and a failed migration that leaves nothing behind."""

import pytest
from sqlalchemy import create_engine, inspect, text

from polarproxy.store import CallResult, CallStart, EpisodeStart, Store, schema
from polarproxy.store import migrations as mig
from polarproxy.store.arrays import pack_ids, pack_logprobs
from polarproxy.store.urls import sqlalchemy_url

ALL = [fn.__name__ for fn in mig.MIGRATIONS]


def _engine(url: str):
    return create_engine(sqlalchemy_url(url) if "://" in url else f"sqlite:///{url}")


def _tables(url: str) -> set[str]:
    engine = _engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _applied(url: str) -> list[str]:
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(text("SELECT name FROM _migrations ORDER BY applied_at")).scalars())
    finally:
        engine.dispose()


def test_blank_database_gets_all_tables_and_records_every_migration(store_url):
    Store.open(store_url).close()
    assert {"_migrations", "episodes", "calls"} <= _tables(store_url)
    assert _applied(store_url) == ALL


def test_reopening_applies_nothing(store_url):
    Store.open(store_url).close()
    with Store.open(store_url) as store:
        assert mig.migrate(store.engine) == []
    assert _applied(store_url) == ALL


def test_migrations_are_named_in_order():
    assert ALL[0] == "m001_initial"
    assert sorted(ALL) == ALL and len(set(ALL)) == len(ALL)
    assert all(name[:5] == f"m{i:03d}_" for i, name in enumerate(ALL, start=1))


def test_migrated_database_matches_the_tables_in_schema_module(store):
    insp = inspect(store.engine)
    for table in schema.metadata.sorted_tables:
        stored = {c["name"]: c for c in insp.get_columns(table.name)}
        assert list(stored) == [c.name for c in table.columns], table.name
        for col in table.columns:
            assert stored[col.name]["nullable"] == col.nullable, (table.name, col.name)
        indexes = {
            i["name"]: (tuple(i["column_names"]), bool(i["unique"])) for i in insp.get_indexes(table.name)
        }
        assert indexes == {i.name: (tuple(c.name for c in i.columns), bool(i.unique)) for i in table.indexes}
        fks = {
            (tuple(fk["constrained_columns"]), fk["referred_table"])
            for fk in insp.get_foreign_keys(table.name)
        }
        assert fks == {((fk.parent.name,), fk.column.table.name) for fk in table.foreign_keys}


def _open_at_m001(url: str, monkeypatch) -> None:
    with monkeypatch.context() as m:
        m.setattr(mig, "MIGRATIONS", mig.MIGRATIONS[:1])
        Store.open(url).close()
    assert _applied(url) == ["m001_initial"]


_M001_EPISODE = (
    "INSERT INTO episodes (id, command_json, harness, status, started_at, metadata_json, next_seq) "
    "VALUES (:id, '[\"agent\"]', 'pi', 'ok', 1000.0, '{}', 2)"
)
_M001_CALL = (
    "INSERT INTO calls (id, episode_id, seq, dialect, method, path, model, stream, status, "
    "request_headers_json, request_body, prompt_tail_ids, prompt_len, output_ids, output_logprobs, "
    "output_len, backend, backend_kind, fidelity, render_mode, started_at, finish_reason) VALUES "
    "(:id, 'ep_m001', :seq, 'openai_chat', 'POST', '/v1/chat/completions', 'm', :stream, 'ok', '{}', '{}', "
    ":prompt, :prompt_len, :output, :logprobs, :output_len, 'http://b', 'sglang', 'tokens', 'fresh', :t, 'stop')"
)


def test_upgrade_from_the_first_released_schema_keeps_its_rows(store_url, monkeypatch):
    """A database written by the first release (m001 only, every prompt stored whole) is upgraded in
    place: its rows read back exactly, and new calls go on from its sequence numbers."""
    _open_at_m001(store_url, monkeypatch)
    prompts = [list(range(100, 140)), [*range(100, 140), 7, 8, *range(200, 230)]]
    outputs = [[7, 8], [9, 10, 11]]
    engine = _engine(store_url)
    with engine.begin() as conn:
        conn.execute(text(_M001_EPISODE), {"id": "ep_m001"})
        for seq, (p, o) in enumerate(zip(prompts, outputs, strict=True)):
            conn.execute(
                text(_M001_CALL),
                {
                    "id": f"call_m001_{seq}",
                    "seq": seq,
                    "stream": seq == 1,
                    "prompt": pack_ids(p),
                    "prompt_len": len(p),
                    "output": pack_ids(o),
                    "logprobs": pack_logprobs([-0.5] * len(o)),
                    "output_len": len(o),
                    "t": 1000.0 + seq,
                },
            )
    engine.dispose()

    with Store.open(store_url) as store:
        assert _applied(store_url) == ALL
        (ep,) = store.list_episodes()
        assert (ep.id, ep.calls, ep.tokens, ep.status) == ("ep_m001", 2, 40 + 2 + 72 + 3, "ok")
        calls = store.list_calls("ep_m001")
        assert [c.prompt_ids for c in calls] == prompts
        assert [c.output_ids for c in calls] == outputs
        assert [c.prompt_base_call_id for c in calls] == [None, None]
        assert [c.stream for c in calls] == [False, True]
        # a new call continues the sequence and may use an old call as its base (read back, verified)
        new_prompt = [*prompts[1], *outputs[1], 300, 301]
        cid, seq = store.begin_call(
            CallStart(
                episode_id="ep_m001",
                dialect="openai_chat",
                method="POST",
                path="/v1/chat/completions",
                model="m",
                stream=False,
                request_headers={},
                request_body="{}",
                conversation=None,
                prompt_ids=new_prompt,
                extended_from="call_m001_1",
            )
        )
        store.finish_call(cid, CallResult(status="ok", output_ids=[5], output_logprobs=[-1.0]))
        assert seq == 2
        call = store.get_call(cid)
        assert call.prompt_ids == new_prompt
        assert (call.prompt_base_call_id, call.prompt_base_len) == ("call_m001_1", 72 + 3)
        other = store.create_episode(EpisodeStart(command=["x"]))
        assert store.get_episode(other).status == "running"


def test_upgrade_applies_only_the_new_migration_once(store_url, monkeypatch):
    Store.open(store_url).close()

    def m999_add_notes(conn):
        conn.execute(text("ALTER TABLE episodes ADD COLUMN notes TEXT"))

    monkeypatch.setattr(mig, "MIGRATIONS", [*mig.MIGRATIONS, m999_add_notes])
    Store.open(store_url).close()
    Store.open(store_url).close()
    assert _applied(store_url) == [*ALL, "m999_add_notes"]
    engine = _engine(store_url)
    assert "notes" in {c["name"] for c in inspect(engine).get_columns("episodes")}
    engine.dispose()


def test_failed_migration_rolls_back_completely(store_url, monkeypatch):
    def m999_half_done(conn):
        conn.execute(text("CREATE TABLE half (x INTEGER)"))
        raise RuntimeError("boom")

    monkeypatch.setattr(mig, "MIGRATIONS", [*mig.MIGRATIONS, m999_half_done])
    with pytest.raises(RuntimeError, match="boom"):
        Store.open(store_url)
    # Nothing of the failed run stays, not even m001, which ran in the same transaction.
    assert _tables(store_url) <= {"_migrations"}
    monkeypatch.setattr(mig, "MIGRATIONS", mig.MIGRATIONS[:-1])
    Store.open(store_url).close()
    assert _applied(store_url) == ALL and "half" not in _tables(store_url)


def test_two_stores_opening_one_blank_database_at_once_migrate_it_once(store_url):
    import threading

    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def opener() -> None:
        try:
            barrier.wait()
            Store.open(store_url).close()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _applied(store_url) == ALL
