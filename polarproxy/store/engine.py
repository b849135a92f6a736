"""Engines and transactions: SQLite pragmas per connection, and write transactions that take the lock first.

SQLite: WAL journal, synchronous=NORMAL (a commit survives a crash of the process; only an OS crash or power
loss can lose the last commits), a 10 s busy timeout and foreign keys, all set on every new connection.
The driver's own transaction handling is switched off and SQLAlchemy's `begin` emits `BEGIN` for reads and
`BEGIN IMMEDIATE` for writes, so a read-then-write transaction (allocating a call's sequence number) holds
the write lock from its first statement, across threads and processes. Before `BEGIN IMMEDIATE`, polarproxy's
writers of one file take turns through an flock of `<file>-writelock` (`WriterTurns`): SQLite's own busy
handler sleeps 1, 2, 5, 10, 15, 20, 25 ms... between tries, so with several writer processes its lock sat
idle most of the time; a released flock is taken within `TURN_POLL_MAX_S`. The flock only orders
polarproxy's writers: SQLite's lock is still what makes a transaction safe, and after `BUSY_TIMEOUT_S`
without a turn (or when the side file cannot be opened) a writer goes ahead and waits on SQLite's lock alone.

PostgreSQL (psycopg 3): a small connection pool per process; a pooled connection that sat idle for
`PG_PING_IDLE_S` or more is pinged before it is handed out (one replaced by a server restart is not given
to a write), one used moments ago is not: the writer's back-to-back group commits skip a round trip
each. A connection that dies between two quick uses fails that transaction like any outage (the
writer spools it, store/spool.py) and SQLAlchemy then replaces the pool's connections. Transactions are READ
COMMITTED, and the writes that must be atomic are single statements (`UPDATE ... RETURNING` for a sequence
number, which locks only that episode's row), so writers of different episodes never wait on each other.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.pool import StaticPool

BUSY_TIMEOUT_S = 10.0
TURN_POLL_MIN_S = 0.0001  # how often a waiting writer tries the writers' flock: first, and at most
TURN_POLL_MAX_S = 0.0005
# PostgreSQL: connections per process. A proxy writes from one thread (group commit) and reads from a few,
# so a handful each lets many proxies share one server (max_connections is 100 by default).
PG_POOL_SIZE = 4
PG_POOL_OVERFLOW = 8
PG_PING_IDLE_S = 1.0  # a pooled connection idle this long is pinged before use
_WRITE = "polarproxy_write"


def is_sqlite_memory(url: str | URL) -> bool:
    u = make_url(url)
    return u.get_backend_name() == "sqlite" and u.database in (None, "", ":memory:")


def make_engine(url: str) -> Engine:
    """An engine for a SQLAlchemy URL, configured as described in the module docstring."""
    u = make_url(url)
    if u.get_backend_name() == "postgresql":
        engine = create_engine(
            u,
            pool_size=PG_POOL_SIZE,
            max_overflow=PG_POOL_OVERFLOW,
            pool_timeout=BUSY_TIMEOUT_S,
            connect_args={"connect_timeout": int(BUSY_TIMEOUT_S), "application_name": "polarproxy"},
        )
        _ping_when_idle(engine)
        return engine
    if u.get_backend_name() != "sqlite":
        return create_engine(u, pool_pre_ping=True)
    kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False, "timeout": BUSY_TIMEOUT_S}}
    if is_sqlite_memory(url):
        kwargs["poolclass"] = StaticPool  # one shared in-memory database, not one per thread
    engine = create_engine(u, **kwargs)
    if not is_sqlite_memory(url):
        _TURNS[engine] = WriterTurns(str(u.database) + "-writelock")

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


def _ping_when_idle(engine: Engine) -> None:
    """SQLAlchemy's pre-ping, for connections idle `PG_PING_IDLE_S` or more only (module docstring). A
    failed ping that is a disconnect makes the pool take a new connection (`DisconnectionError`)."""

    @event.listens_for(engine, "checkin")
    def _idle_from(_dbapi_connection: Any, record: Any) -> None:
        record.info["polarproxy_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("polarproxy_idle_since")
        if since is None or time.monotonic() - since < PG_PING_IDLE_S:
            return  # a new connection, or one that answered moments ago
        try:
            engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as e:
            if engine.dialect.is_disconnect(e, dbapi_connection, None):
                raise DisconnectionError(f"pooled connection lost: {e}") from e
            raise


def _set_wal(cursor: Any) -> None:
    """`PRAGMA journal_mode = WAL`, retried: on a blank file that other connections are opening at the same
    moment, SQLite answers "database is locked" at once, without waiting out the busy timeout."""
    import sqlite3

    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class _Fd:
    """An open file descriptor, closed when the object goes (a thread's, see WriterTurns)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


class WriterTurns:
    """Polarproxy's write transactions on one SQLite file, one at a time, through an flock of a side file
    (each thread its own descriptor, so threads take turns too; the kernel drops a dead process's lock)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._local = threading.local()

    def _fd(self) -> int:
        held: _Fd | None = getattr(self._local, "fd", None)
        if held is None:
            try:
                held = _Fd(os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644))
            except OSError:  # a read-only folder, a full disk: SQLite's lock alone
                held = _Fd(-1)
            self._local.fd = held
        return held.fd

    @contextmanager
    def turn(self, *, wait: bool = True) -> Iterator[None]:
        """The writers' turn; `wait=False`: only if no other writer has it now, else `WriteBusy`."""
        fd = self._fd()
        if wait:
            got = fd >= 0 and _flock(fd, time.monotonic() + BUSY_TIMEOUT_S)
        else:
            got = fd >= 0 and _flock(fd, 0.0)
            if not got:
                raise WriteBusy(f"another writer of {self.path.removesuffix('-writelock')} is writing")
        try:
            yield
        finally:
            if got:
                fcntl.flock(fd, fcntl.LOCK_UN)


class WriteBusy(Exception):
    """A write that would have to wait (`HeldConnection(wait=False)`): nothing was written; write it where
    waiting is fine."""


def _flock(fd: int, deadline: float) -> bool:
    """Take the flock, trying until `deadline` (0: once)."""
    delay = TURN_POLL_MIN_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(delay)
            delay = min(2 * delay, TURN_POLL_MAX_S)
        except OSError:
            return False


_TURNS: weakref.WeakKeyDictionary[Engine, WriterTurns] = weakref.WeakKeyDictionary()


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction that will write: committed (and on disk) when the block exits without error."""
    turns = _TURNS.get(engine)
    with nullcontext() if turns is None else turns.turn(), engine.connect() as conn:
        conn.execution_options(**{_WRITE: True})
        with conn.begin():
            yield conn


@contextmanager
def read_transaction(engine: Engine) -> Iterator[Connection]:
    """A read-only transaction: one consistent snapshot for the block."""
    with engine.connect() as conn, conn.begin():
        yield conn


class HeldConnection:
    """A SQLite file's connection kept by one writer for its call writes (module docstring). Its
    transactions run statements on the driver; errors are raised as SQLAlchemy's. After the engine's pool
    is replaced (`Engine.dispose`) it connects again, as the pool's users do. Not for concurrent use."""

    def __init__(self, engine: Engine, *, wait: bool = True) -> None:
        self.engine = engine
        self.dialect = engine.dialect
        self.wait = wait
        self._turns = _TURNS.get(engine)
        self._proxied: Any = None  # the pool's connection, checked out for as long as it is held
        self._pool: Any = None

    def _driver(self) -> sqlite3.Connection:
        if self._proxied is not None and self._pool is self.engine.pool:
            return self._proxied.driver_connection  # type: ignore[no-any-return]
        self.close()
        pool = self.engine.pool
        proxied = self.engine.raw_connection()  # SQLAlchemy's errors if the file cannot be opened
        db: sqlite3.Connection = proxied.driver_connection
        if not self.wait:
            db.execute("PRAGMA busy_timeout = 0")
            db.execute("PRAGMA wal_autocheckpoint = 0")
        self._proxied, self._pool = proxied, pool
        return db

    @contextmanager
    def transaction(self) -> Iterator[DriverConnection]:
        """A write transaction (`BEGIN IMMEDIATE`), committed when the block exits without error."""
        with nullcontext() if self._turns is None else self._turns.turn(wait=self.wait):
            conn = DriverConnection(self.dialect, self._driver())
            try:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
                yield conn
                conn.exec_driver_sql("COMMIT")
            except BaseException:
                self.close()  # rolls back whatever is open; the next transaction connects again
                raise

    def close(self) -> None:
        proxied, self._proxied = self._proxied, None
        if proxied is not None:
            try:
                proxied.invalidate()  # closed, not returned: its pragmas may differ from the pool's
            except Exception:  # closing is best effort (the file may be gone)
                pass


class DriverConnection:
    """What the call writes use of a SQLAlchemy `Connection` (`exec_driver_sql` with positional parameters,
    a list of them for executemany), on a driver connection inside a `HeldConnection` transaction."""

    __slots__ = ("_db", "dialect")

    def __init__(self, dialect: Any, db: sqlite3.Connection) -> None:
        self.dialect = dialect
        self._db = db

    def exec_driver_sql(self, sql: str, params: Any = ()) -> DriverRows:
        try:
            cursor = (
                self._db.executemany(sql, params)
                if isinstance(params, list)
                else self._db.execute(sql, params)
            )
        except sqlite3.Error as e:
            raise _wrapped(sql, e) from e
        return DriverRows(cursor)


class DriverRows:
    """A cursor as the call writes read a SQLAlchemy result: `all()`, iteration, `rowcount`."""

    __slots__ = ("_cursor",)

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor

    def all(self) -> list[Any]:
        return self._cursor.fetchall()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor)

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount


def _wrapped(sql: str, e: sqlite3.Error) -> DBAPIError:
    """The driver's error as SQLAlchemy raises it (OperationalError, IntegrityError, ...), parameters hidden."""
    return DBAPIError.instance(sql, None, e, sqlite3.Error, hide_parameters=True)
