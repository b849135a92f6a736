"""Engines and transactions: SQLite pragmas per connection, and write transactions that take the lock first.

SQLite: WAL journal, synchronous=NORMAL (a commit survives a crash of the process; only an OS crash or power
loss can lose the last commits), a 10 s busy timeout and foreign keys, all set on every new connection.
The driver's own transaction handling is switched off and SQLAlchemy's `begin` emits `BEGIN` for reads and
`BEGIN IMMEDIATE` for writes, so a read-then-write transaction (allocating a call's sequence number) holds
the write lock from its first statement, across threads and processes.

PostgreSQL (psycopg 3): a small connection pool per process, checked before use; transactions are READ
COMMITTED, and the writes that must be atomic are single statements (`UPDATE ... RETURNING` for a sequence
number, which locks only that episode's row), so writers of different episodes never wait on each other.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import StaticPool

BUSY_TIMEOUT_S = 10.0
# PostgreSQL: connections per process. A proxy writes from one thread (group commit) and reads from a few,
# so a handful each lets many proxies share one server (max_connections is 100 by default).
PG_POOL_SIZE = 4
PG_POOL_OVERFLOW = 8
_WRITE = "polarproxy_write"


def is_sqlite_memory(url: str) -> bool:
    u = make_url(url)
    return u.get_backend_name() == "sqlite" and u.database in (None, "", ":memory:")


def make_engine(url: str) -> Engine:
    """An engine for a SQLAlchemy URL, configured as described in the module docstring."""
    u = make_url(url)
    if u.get_backend_name() == "postgresql":
        return create_engine(
            u,
            pool_pre_ping=True,  # a connection dropped by a server restart is replaced, not handed out
            pool_size=PG_POOL_SIZE,
            max_overflow=PG_POOL_OVERFLOW,
            pool_timeout=BUSY_TIMEOUT_S,
            connect_args={"connect_timeout": int(BUSY_TIMEOUT_S), "application_name": "polarproxy"},
        )
    if u.get_backend_name() != "sqlite":
        return create_engine(u, pool_pre_ping=True)
    kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False, "timeout": BUSY_TIMEOUT_S}}
    if is_sqlite_memory(url):
        kwargs["poolclass"] = StaticPool  # one shared in-memory database, not one per thread
    engine = create_engine(u, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (see _on_begin)
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            _set_wal(cursor)
            cursor.execute("PRAGMA synchronous = NORMAL")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_WRITE) else "BEGIN")

    return engine


def _set_wal(cursor: Any) -> None:
    """`PRAGMA journal_mode = WAL`, retried: on a blank file that other connections are opening at the same
    moment, SQLite answers "database is locked" at once, without waiting out the busy timeout."""
    import sqlite3
    import time

    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction that will write: committed (and on disk) when the block exits without error."""
    with engine.connect() as conn:
        conn.execution_options(**{_WRITE: True})
        with conn.begin():
            yield conn


@contextmanager
def read_transaction(engine: Engine) -> Iterator[Connection]:
    """A read-only transaction: one consistent snapshot for the block."""
    with engine.connect() as conn, conn.begin():
        yield conn
