"""PostgreSQL's connection pool: a connection idle for a while is pinged before use (one the server dropped
is replaced, not handed to a write); one used moments ago is not pinged (store/engine.py)."""

from __future__ import annotations

import psycopg
import pytest

from polarproxy.store import EpisodeStart, Store, engine


def _drop_polarproxy_connections(url: str) -> int:
    """What a server restart does to the pool: every polarproxy connection is ended from the server side."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = 'polarproxy' AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


def test_a_connection_the_server_dropped_is_replaced_after_idling(pg_server, monkeypatch):
    monkeypatch.setattr(engine, "PG_PING_IDLE_S", 0.0)  # every checkout counts as idle
    url = pg_server.create_database()
    store = Store.open(url)
    try:
        store.create_episode(EpisodeStart(command=["a"]))
        assert _drop_polarproxy_connections(url) >= 1
        # the pooled connection is dead: the ping finds out and the pool hands out a new one
        eid = store.create_episode(EpisodeStart(command=["b"]))
        assert store.get_episode(eid).command == ["b"]
    finally:
        store.close()


def test_a_connection_used_moments_ago_is_not_pinged(pg_server, monkeypatch):
    monkeypatch.setattr(engine, "PG_PING_IDLE_S", 3600.0)  # nothing is idle that long here
    url = pg_server.create_database()
    store = Store.open(url)
    try:
        store.create_episode(EpisodeStart(command=["a"]))
        pinged: list[object] = []
        monkeypatch.setattr(store.engine.dialect, "do_ping", lambda c: pinged.append(c) or True)
        for _ in range(3):
            store.create_episode(EpisodeStart(command=["b"]))
        assert pinged == []
        monkeypatch.setattr(engine, "PG_PING_IDLE_S", 0.0)
        store.create_episode(EpisodeStart(command=["c"]))
        assert len(pinged) == 1  # idle (by the new bound): pinged once, at its checkout
    finally:
        store.close()


def test_a_dropped_connection_without_a_ping_fails_the_write_and_the_next_one_succeeds(
    pg_server, monkeypatch
):
    """Used moments ago, so not pinged: the write on it fails as an outage would (the proxy's writer spools
    it); SQLAlchemy then replaces the pool's connections and the next write goes through."""
    monkeypatch.setattr(engine, "PG_PING_IDLE_S", 3600.0)
    url = pg_server.create_database()
    store = Store.open(url)
    try:
        store.create_episode(EpisodeStart(command=["a"]))
        _drop_polarproxy_connections(url)
        with pytest.raises(Exception):  # noqa: B017 - the driver's OperationalError, as StoreError
            store.create_episode(EpisodeStart(command=["b"]))
        eid = store.create_episode(EpisodeStart(command=["c"]))
        assert store.get_episode(eid).command == ["c"]
    finally:
        store.close()
