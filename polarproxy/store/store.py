"""The store: episodes and calls in SQLite (default) or PostgreSQL, through SQLAlchemy.

Writes (`create_episode`, `begin_call`, `finish_call`, ...) commit before they return, so a call is on disk
when `begin_call` / `finish_call` return (T6). A `Store` may be used from several threads at once, and
several processes may write one SQLite file: sequence numbers are handed out inside a write transaction.

`Store` is opening, transactions and group commits (`batch`); its methods live in one module per concept:
episodes.py (episodes and ID lookups), call_writes.py (beginning and finishing calls, one or a group),
call_reads.py (reading calls back), rewards.py (rewards).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import ArgumentError, IntegrityError, SQLAlchemyError

from polarproxy.store.bases import RecentCalls
from polarproxy.store.call_reads import CALL_STATUSES, CallReadsMixin
from polarproxy.store.call_writes import MIN_REFERENCE_TOKENS, CallWritesMixin
from polarproxy.store.engine import (
    HeldConnection,
    is_sqlite_memory,
    make_engine,
    read_transaction,
    write_transaction,
)
from polarproxy.store.episodes import EPISODE_STATUSES, EpisodesMixin
from polarproxy.store.errors import StoreError
from polarproxy.store.migrations import migrate
from polarproxy.store.rewards import RewardsMixin
from polarproxy.store.urls import display_url, is_url, sqlalchemy_url

__all__ = ["CALL_STATUSES", "EPISODE_STATUSES", "MIN_REFERENCE_TOKENS", "Store", "default_db_url"]


def default_db_url() -> str:
    """`$POLARPROXY_DB` (a path or a URL, e.g. postgresql://user@host/db) if set, else
    `$XDG_DATA_HOME/polarproxy/polarproxy.db` (`~/.local/share/polarproxy/polarproxy.db` without
    XDG_DATA_HOME)."""
    env = os.environ.get("POLARPROXY_DB")
    if env:
        return env
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(data_home) / "polarproxy" / "polarproxy.db")


def _transaction_failed(conn: Connection) -> bool:
    """PostgreSQL: whether a statement of the open transaction failed (it can then only roll back; a
    COMMIT would silently roll back the writes before the failure)."""
    if conn.dialect.name != "postgresql":
        return False
    from psycopg.pq import TransactionStatus

    raw = conn.connection.dbapi_connection
    return raw is not None and raw.info.transaction_status == TransactionStatus.INERROR


class Store(EpisodesMixin, CallWritesMixin, CallReadsMixin, RewardsMixin):
    """Episodes and calls. Open with `Store.open(url_or_path)`; close with `close()` or a `with` block."""

    def __init__(self, engine: Engine, *, url: str):
        self.engine = engine
        self.connect_url = url  # holds the password, if any: never print or log it
        self.url = display_url(url)  # what may be shown (T5)
        self.dialect: str = engine.dialect.name  # 'sqlite' | 'postgresql'
        self._recent = RecentCalls()  # committed token sequences, to store new prompts as references
        # A shared in-memory SQLite database is one connection: serialize its transactions.
        self._lock: AbstractContextManager[Any] = (
            threading.RLock() if is_sqlite_memory(url) else nullcontext()
        )
        self._local = threading.local()  # the open batch transaction of this thread, if any

    # ---- opening -------------------------------------------------------------------------------------

    @classmethod
    def open(cls, url: str | os.PathLike[str] | None = None) -> Store:
        """Open (creating and migrating as needed) the database at a path or SQLAlchemy URL.

        None means `default_db_url()`; a plain path is a SQLite file (parent folders are created);
        `:memory:` is a private in-memory SQLite database; `postgresql://user@host:port/db` is PostgreSQL
        through psycopg 3 (see urls.py).
        """
        target = default_db_url() if url is None else os.fspath(url)
        shown = display_url(target)
        if target == ":memory:":
            sa_url = "sqlite://"
        elif is_url(target):
            try:
                sa_url = sqlalchemy_url(target).render_as_string(hide_password=False)
            except (ArgumentError, ValueError) as exc:
                raise StoreError(
                    f"Cannot open the database {shown}: {exc}. "
                    "Use sqlite:///PATH, postgresql://USER@HOST:PORT/DB, or a plain file path."
                ) from exc
        else:
            path = Path(target).expanduser()
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(
                    f"Cannot create the folder for the database {path}: {exc.strerror or exc}. "
                    "Pass --db PATH or set POLARPROXY_DB to a writable location."
                ) from exc
            if path.is_dir():
                raise StoreError(
                    f"Cannot open the database {path}: it is a folder. "
                    "Pass --db PATH or set POLARPROXY_DB to a file path."
                )
            sa_url = "sqlite:///" + str(path.resolve())
        try:
            engine = make_engine(sa_url)
        except (ArgumentError, ImportError, ValueError) as exc:
            raise StoreError(
                f"Cannot open the database {shown}: {exc}. "
                "Check the URL (sqlite:///PATH or postgresql://...) and that its driver is installed."
            ) from exc
        store = cls(engine, url=sa_url)
        try:
            with store._lock:
                migrate(engine)
        except (SQLAlchemyError, OSError) as exc:
            engine.dispose()
            reason = getattr(exc, "orig", None) or exc
            raise StoreError(
                f"Cannot open the database {shown}: {reason}. "
                "Check that it is a polarproxy database and writable, or pass --db / set POLARPROXY_DB "
                "to another location."
            ) from exc
        return store

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def held_connection(self, *, wait: bool = True) -> HeldConnection | None:
        """A connection for one writer's call writes (`batch(held)`), kept between transactions; None where
        the store has none (PostgreSQL, in-memory SQLite): there `batch()` is the way. engine.py says why."""
        if self.dialect != "sqlite" or is_sqlite_memory(self.connect_url):
            return None
        return HeldConnection(self.engine, wait=wait)

    @contextmanager
    def batch(self, held: HeldConnection | None = None) -> Iterator[None]:
        """Run this thread's writes inside one transaction, committed once when the block exits.

        Group commit for the proxy's writer thread: under load one commit covers many calls. If any write
        in the block fails, the whole block is rolled back and the error propagates. On a `held` connection
        only call writes (`write_calls`, `write_prepared` and the calls that use them) may run."""
        if getattr(self._local, "conn", None) is not None:
            yield
            return
        with self._write(held) as conn:  # its after-commit actions run once the whole block committed
            self._local.conn = conn
            try:
                yield
            finally:
                self._local.conn = None

    @contextmanager
    def _write(self, held: HeldConnection | None = None) -> Iterator[Connection]:
        batch = getattr(self._local, "conn", None)
        if batch is not None:
            yield batch
            return
        hooks: list[Callable[[], None]] = []
        self._local.hooks = hooks
        transaction: AbstractContextManager[Any] = (
            write_transaction(self.engine) if held is None else held.transaction()
        )
        try:
            try:
                with self._lock, transaction as conn:
                    yield conn
                    if _transaction_failed(conn):
                        raise StoreError(
                            f"A write to {self.url} failed inside a transaction; it was rolled back. "
                            "Retry the writes one by one."
                        )
            finally:
                self._local.hooks = None
        except IntegrityError:
            raise
        except SQLAlchemyError as exc:
            raise self._error("write to", exc) from exc
        for fn in hooks:  # committed: now what was written may be remembered
            fn()

    def _after_commit(self, fn: Callable[[], None]) -> None:
        """Run `fn` once the current write transaction (or batch) has committed; never if it rolls back."""
        self._local.hooks.append(fn)

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        try:
            with self._lock, read_transaction(self.engine) as conn:
                yield conn
        except SQLAlchemyError as exc:
            raise self._error("read", exc) from exc

    def _error(self, verb: str, exc: SQLAlchemyError) -> StoreError:
        reason = getattr(exc, "orig", None) or exc
        return StoreError(
            f"Cannot {verb} the database {self.url}: {reason}. Check free disk space and that no other "
            "program holds a long write lock on it."
        )
