"""The store: episodes and calls in SQLite (default) or any SQLAlchemy URL, through SQLAlchemy Core.

Writes (`create_episode`, `begin_call`, `finish_call`, ...) commit before they return, so a call is on disk
when `begin_call` / `finish_call` return (T6). A `Store` may be used from several threads at once, and
several processes may write one SQLite file: sequence numbers are handed out inside a write transaction.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any, get_args

import orjson
from sqlalchemy import Connection, Engine, Row, and_, bindparam, func, or_, select
from sqlalchemy.exc import ArgumentError, IntegrityError, SQLAlchemyError

from polarproxy.redact import REDACTED, redact_argv, redact_headers, redact_path
from polarproxy.store import schema, textdelta
from polarproxy.store.arrays import pack_ids, pack_logprobs
from polarproxy.store.bases import Base, Known, RecentCalls, choose_base
from polarproxy.store.call_rows import call_from_row
from polarproxy.store.engine import is_sqlite_memory, make_engine, read_transaction, write_transaction
from polarproxy.store.errors import AmbiguousIdError, NotFoundError, StoreError
from polarproxy.store.ids import CALL_PREFIX, EPISODE_PREFIX, new_call_id, new_episode_id
from polarproxy.store.migrations import migrate
from polarproxy.store.query import EpisodeQuery
from polarproxy.store.rebuild import (
    BODY_COLUMNS,
    TOKEN_COLUMNS,
    BodyRebuilder,
    BodyRow,
    Rebuilder,
    TokenRow,
    body_row,
    token_row,
)
from polarproxy.store.records import (
    Call,
    CallResult,
    CallStart,
    CallStatus,
    Episode,
    EpisodeStart,
    EpisodeStatus,
)
from polarproxy.store.rewards import RewardsMixin
from polarproxy.store.urls import display_url, is_url, sqlalchemy_url

log = logging.getLogger(__name__)

CALL_STATUSES: tuple[str, ...] = get_args(CallStatus)
EPISODE_STATUSES: tuple[str, ...] = get_args(EpisodeStatus)
_BATCH = 64  # calls read per transaction by iter_calls
MIN_REFERENCE_TOKENS = 8  # shorter prompts are always stored whole

E = schema.episodes
C = schema.calls
R = schema.rewards

# Hot-path statements, built once; values are passed as parameters (no per-call statement construction).
_NEXT_SEQ = (
    E.update()
    .where(E.c.id == bindparam("b_episode_id"))
    .values(next_seq=E.c.next_seq + 1)
    .returning(E.c.next_seq)
)
_INSERT_CALL = C.insert()
# The prompt base as begin_call checks it inside its write transaction; on PostgreSQL share-locked.
_BASE_ROW = select(C.c.episode_id, C.c.prompt_len, C.c.output_len).where(C.c.id == bindparam("b_base_id"))
_BASE_ROW_LOCKED = _BASE_ROW.with_for_update(read=True)
_LATER = C.alias("later")
# SET: the parameters given. A finished call whose output later calls use as part of their prompt keeps
# that output: finishing it again is allowed only with the same output IDs (a replay), else no row matches.
_FINISH_CALL = C.update().where(
    C.c.id == bindparam("b_call_id"),
    or_(
        C.c.status == "in_flight",
        C.c.output_ids == bindparam("b_output_ids"),
        ~select(_LATER.c.id)
        .where(_LATER.c.prompt_base_call_id == C.c.id, _LATER.c.prompt_base_len > C.c.prompt_len)
        .exists(),
    ),
)


def default_db_url() -> str:
    """`$POLARPROXY_DB` (a path or a URL, e.g. postgresql://user@host/db) if set, else
    `$XDG_DATA_HOME/polarproxy/polarproxy.db` (`~/.local/share/polarproxy/polarproxy.db` without
    XDG_DATA_HOME)."""
    env = os.environ.get("POLARPROXY_DB")
    if env:
        return env
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(data_home) / "polarproxy" / "polarproxy.db")


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _loads(text: str | None) -> Any:
    return None if text is None else orjson.loads(text)


def _redacted_headers(headers: dict[str, str]) -> dict[str, str]:
    """Defence in depth for T5: the capture layer redacts first; anything it missed is replaced here."""
    out = redact_headers(headers.items())
    if out != headers:
        log.warning("Secret headers reached the store unredacted; storing them as %s.", REDACTED)
    return out


def _redacted_command(command: list[str]) -> list[str]:
    out = redact_argv(command)
    if out != command:
        log.warning(
            "Secrets on an episode's command line reached the store unredacted; storing them as %s.", REDACTED
        )
    return out


def _redacted_path(path: str) -> str:
    out = redact_path(path)
    if out != path:
        log.warning("Secret query parameters reached the store unredacted; storing them as %s.", REDACTED)
    return out


def _insert_unless_exists(conn: Connection) -> Any:
    """An episode INSERT that inserts nothing (and returns no row) when the ID exists, instead of failing."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(E).on_conflict_do_nothing(index_elements=[E.c.id])
    if conn.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(E).on_conflict_do_nothing(index_elements=[E.c.id])
    return E.insert()


def _transaction_failed(conn: Connection) -> bool:
    """PostgreSQL: whether a statement of the open transaction failed (it can then only roll back; a
    COMMIT would silently roll back the writes before the failure)."""
    if conn.dialect.name != "postgresql":
        return False
    from psycopg.pq import TransactionStatus

    raw = conn.connection.dbapi_connection
    return raw is not None and raw.info.transaction_status == TransactionStatus.INERROR


def _bodies_delta(base: Known, bodies: tuple[str, str | None]) -> bytes | None:
    """The request body and conversation as compressed edits of the base call's, or None (stored whole)
    when that is not smaller."""
    delta = textdelta.encode(base.bodies, bodies)
    return delta if len(delta) < len(bodies[0]) + len(bodies[1] or "") else None


def _temperature(start: CallStart) -> float | None:
    if start.temperature is not None:
        return float(start.temperature)
    value = ((start.conversation or {}).get("sampling") or {}).get("temperature")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class Store(RewardsMixin):
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

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Run this thread's writes inside one transaction, committed once when the block exits.

        Group commit for the proxy's writer thread: under load one commit covers many calls. If any write
        in the block fails, the whole block is rolled back and the error propagates."""
        if getattr(self._local, "conn", None) is not None:
            yield
            return
        with self._write() as conn:  # its after-commit actions run once the whole block committed
            self._local.conn = conn
            try:
                yield
            finally:
                self._local.conn = None

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        batch = getattr(self._local, "conn", None)
        if batch is not None:
            yield batch
            return
        hooks: list[Callable[[], None]] = []
        self._local.hooks = hooks
        try:
            try:
                with self._lock, write_transaction(self.engine) as conn:
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

    # ---- episodes ------------------------------------------------------------------------------------

    def create_episode(
        self, start: EpisodeStart, *, episode_id: str | None = None, exist_ok: bool = False
    ) -> str:
        """Insert a `running` episode and return its ID (a new time-ordered one unless given).

        With a given `episode_id` that already exists: `exist_ok=True` returns it unchanged (an atomic
        "ensure"), otherwise StoreError."""
        values = {
            "command_json": _dumps(_redacted_command(list(start.command))),
            "harness": start.harness,
            "cwd": start.cwd,
            "task": start.task,
            "group_id": start.group_id,
            "status": "running",
            "started_at": time.time(),
            "metadata_json": _dumps(start.metadata),
            "next_seq": 0,
        }
        for _attempt in range(3):
            eid = episode_id or new_episode_id()
            # ON CONFLICT DO NOTHING, not a caught IntegrityError: on PostgreSQL an error aborts the whole
            # transaction, which may be a batch holding other writes.
            with self._write() as conn:
                inserted = conn.execute(
                    _insert_unless_exists(conn).values(id=eid, **values).returning(E.c.id)
                ).first()
            if inserted:
                return eid
            if episode_id is not None:
                if exist_ok:
                    return episode_id
                raise StoreError(f"Cannot create episode {eid!r}: an episode with that ID exists.")
        raise StoreError("Cannot create an episode: three new IDs in a row were taken. Check the clock.")

    def finish_episode(self, episode_id: str, *, status: EpisodeStatus, exit_code: int | None = None) -> None:
        """Record how the episode ended (status, the harness's exit code) and when."""
        if status not in EPISODE_STATUSES:
            raise ValueError(
                f"Unknown episode status {status!r}. Must be one of {', '.join(map(repr, EPISODE_STATUSES))}."
            )
        with self._write() as conn:
            result = conn.execute(
                E.update()
                .where(E.c.id == episode_id)
                .values(status=status, exit_code=exit_code, ended_at=time.time())
            )
        if result.rowcount == 0:
            raise NotFoundError(f"No episode {episode_id!r}.")

    def list_episodes(
        self,
        limit: int | None = 50,
        offset: int = 0,
        *,
        where: EpisodeQuery | None = None,
    ) -> list[Episode]:
        """Episodes, newest first, with their call and token counts. `limit=None` returns all; `where`
        keeps only the episodes that match it (task, group, status, harness, start time, reward)."""
        query = self._episode_query()
        if where is not None:
            query = query.where(*where.conditions())
        query = query.order_by(E.c.started_at.desc(), E.c.id.desc()).offset(offset)
        if limit is not None:
            query = query.limit(limit)
        with self._read() as conn:
            return [self._episode(row) for row in conn.execute(query)]

    def count_episodes(self, *, where: EpisodeQuery | None = None) -> int:
        """How many episodes there are (that match `where`)."""
        query = select(func.count()).select_from(E)
        if where is not None:
            query = query.where(*where.conditions())
        with self._read() as conn:
            return int(conn.execute(query).scalar_one())

    def get_episode(self, id_or_prefix: str) -> Episode:
        """The episode with this ID, or whose ID alone starts with this prefix (`ep_` may be left off)."""
        eid = self._resolve(E, id_or_prefix, EPISODE_PREFIX, "episode", "polarproxy ls")
        with self._read() as conn:
            row = conn.execute(self._episode_query().where(E.c.id == eid)).one()
        return self._episode(row)

    @staticmethod
    def _episode_query() -> Any:
        # Correlated subqueries: computed only for the episodes returned, through ix_calls_episode_seq.
        calls = select(func.count()).where(C.c.episode_id == E.c.id).scalar_subquery()
        tokens = (
            select(func.coalesce(func.sum(C.c.prompt_len + C.c.output_len), 0))
            .where(C.c.episode_id == E.c.id)
            .scalar_subquery()
        )
        return select(E, calls.label("calls"), tokens.label("tokens"))

    @staticmethod
    def _episode(row: Row[Any]) -> Episode:
        m = row._mapping
        return Episode(
            id=m["id"],
            command=orjson.loads(m["command_json"]),
            harness=m["harness"],
            cwd=m["cwd"],
            task=m["task"],
            group_id=m["group_id"],
            reward=m["reward"],
            status=m["status"],
            exit_code=m["exit_code"],
            started_at=m["started_at"],
            ended_at=m["ended_at"],
            metadata=orjson.loads(m["metadata_json"]),
            calls=int(m["calls"]),
            tokens=int(m["tokens"]),
        )

    def _exists(self, table: Any, id_: str) -> bool:
        with self._read() as conn:
            return conn.execute(select(table.c.id).where(table.c.id == id_)).first() is not None

    def _resolve(self, table: Any, id_or_prefix: str, prefix: str, what: str, hint: str) -> str:
        key = id_or_prefix.strip()
        if not key:
            raise NotFoundError(f"Empty {what} ID. Run `{hint}` to list them.")
        patterns = [key] if key.startswith(prefix) else [key, prefix + key]
        with self._read() as conn:
            exact = conn.execute(select(table.c.id).where(table.c.id.in_(patterns))).scalars().first()
            if exact is not None:
                return exact
            found = list(
                conn.execute(
                    select(table.c.id)
                    .where(or_(*(table.c.id.like(_like_prefix(p), escape="\\") for p in patterns)))
                    .order_by(table.c.id)
                    .limit(6)
                ).scalars()
            )
        if not found:
            raise NotFoundError(f"No {what} ID starts with {key!r}. Run `{hint}` to list them.")
        if len(found) > 1:
            shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
            raise AmbiguousIdError(
                f"{what.capitalize()} ID prefix {key!r} is ambiguous: it matches {shown}. Give more characters.",
                found,
            )
        return found[0]

    # ---- calls ---------------------------------------------------------------------------------------

    def begin_call(self, start: CallStart, *, call_id: str | None = None) -> tuple[str, int]:
        """Insert an `in_flight` call and return (call_id, seq); it is on disk when this returns.

        `call_id` (issue 5 part 5, the spool): an ID made by the caller with `new_call_id()`, so that a call
        spooled while the database was down keeps its ID when it is replayed; default a new one.

        Defensively (the capture layer redacts first) secret headers and query parameters that arrive
        unredacted are stored as `<redacted>`.

        The prompt is stored as a verified reference to an earlier call of the episode plus the tokens it
        adds, when one shares a prefix with it (bases.py); else whole."""
        prompt = pack_ids(start.prompt_ids)
        bodies = (start.request_body, None if start.conversation is None else _dumps(start.conversation))
        chosen = self._choose_base(start, prompt)
        base, delta = (None, None) if chosen is None else (chosen[0], _bodies_delta(chosen[1], bodies))
        values = {
            "episode_id": start.episode_id,
            "dialect": start.dialect,
            "method": start.method,
            "path": _redacted_path(start.path),
            "model": start.model,
            "stream": bool(start.stream),
            "status": "in_flight",
            "request_headers_json": _dumps(_redacted_headers(start.request_headers)),
            "request_body": bodies[0],
            "conversation_json": bodies[1],
            "bodies_delta": None,
            "prompt_base_call_id": None,
            "prompt_base_len": 0,
            "prompt_tail_ids": prompt,
            "prompt_len": len(start.prompt_ids),
            "output_ids": b"",
            "output_logprobs": b"",
            "output_len": 0,
            "backend": start.backend,
            "backend_kind": start.backend_kind,
            "fidelity": start.fidelity,
            "render_mode": start.render_mode,
            "extended_from": start.extended_from,
            "render_note": start.render_note,
            "started_at": start.started_at or time.time(),
            "temperature": _temperature(start),
        }
        call_id = call_id or new_call_id()
        with self._write() as conn:
            next_seq = conn.execute(_NEXT_SEQ, {"b_episode_id": start.episode_id}).scalar_one_or_none()
            if next_seq is None:
                raise NotFoundError(
                    f"No episode {start.episode_id!r} to add a call to. Create it with create_episode first."
                )
            seq = next_seq - 1
            if base is not None and self._base_holds(conn, base, start.episode_id):
                values["prompt_base_call_id"] = base.call_id
                values["prompt_base_len"] = base.length
                values["prompt_tail_ids"] = prompt[4 * base.length :]
                if delta is not None:  # the bodies as edits of the base's (textdelta.py)
                    values.update(request_body="", conversation_json=None, bodies_delta=delta)
            conn.execute(_INSERT_CALL, {"id": call_id, "seq": seq, **values})
            self._after_commit(lambda: self._recent.began(start.episode_id, call_id, prompt, bodies))
        return call_id, seq

    def _choose_base(self, start: CallStart, prompt: bytes) -> tuple[Base, Known] | None:
        if len(prompt) < 4 * MIN_REFERENCE_TOKENS:
            return None
        candidates = self._recent.candidates(start.episode_id)
        hint = start.prompt_base_call_id or start.extended_from
        if hint is not None:
            known = next((k for k in candidates if k.call_id == hint), None) or self._load_known(
                hint, start.episode_id
            )
            if known is not None:
                candidates = [known, *(k for k in candidates if k.call_id != hint)]
        hint_len = start.prompt_base_len if start.prompt_base_call_id else None
        base = choose_base(prompt, candidates, hint=hint, hint_len=hint_len)
        return None if base is None else (base, next(k for k in candidates if k.call_id == base.call_id))

    def _load_known(self, call_id: str, episode_id: str) -> Known | None:
        """A call of `episode_id` that this store does not remember, read back (None if it is not one)."""
        try:
            with self._read() as conn:
                row = conn.execute(
                    select(C.c.episode_id, C.c.prompt_len, C.c.output_len, C.c.status).where(
                        C.c.id == call_id
                    )
                ).first()
            if row is None or row.episode_id != episode_id:
                return None
            full = Rebuilder(self._load_token_row).full_sequence(call_id)
            bodies = BodyRebuilder(self._load_body_row).full(call_id, call_id)
        except StoreError as exc:
            log.debug("prompt base %s not usable: %s", call_id, exc)
            return None
        finished = row.status != "in_flight"
        return Known(
            call_id, episode_id, pack_ids(full), row.prompt_len, row.output_len if finished else None, bodies
        )

    @staticmethod
    def _base_holds(conn: Connection, base: Base, episode_id: str) -> bool:
        """Inside the write transaction: the base is still the call of this episode whose tokens were
        compared (on PostgreSQL its row is share-locked until commit, so its output cannot change)."""
        query = _BASE_ROW_LOCKED if conn.dialect.name == "postgresql" else _BASE_ROW
        row = conn.execute(query, {"b_base_id": base.call_id}).first()
        if row is None or row.episode_id != episode_id or row.prompt_len != base.prompt_len:
            return False
        if base.length <= row.prompt_len:
            return True
        return base.output_len is not None and row.output_len == base.output_len

    def finish_call(self, call_id: str, result: CallResult) -> None:
        """Record how a call ended; on disk when this returns."""
        params = self._finish_params(call_id, result)
        with self._write() as conn:
            updated = conn.execute(_FINISH_CALL, params)
            if updated.rowcount == 1:
                self._after_commit(partial(self._recent.finished, call_id, params["output_ids"]))
        if updated.rowcount == 0:
            raise self._not_finished(call_id)

    def finish_calls(self, results: Sequence[tuple[str, CallResult]]) -> None:
        """`finish_call` for several calls in one transaction and one executemany (the writer thread's group
        commit: one statement for a run of finishes). All or none: if one cannot be finished, nothing is
        written (inside a `batch`, the batch fails) and its error is raised."""
        params = [self._finish_params(call_id, result) for call_id, result in results]
        if not params:
            return
        with self._write() as conn:
            if conn.execute(_FINISH_CALL, params).rowcount != len(params):
                for p in params:  # find the one that matched no row (finishing again is a no-op: a replay)
                    if conn.execute(_FINISH_CALL, p).rowcount == 0:
                        raise self._not_finished(p["b_call_id"])
            for p in params:
                self._after_commit(partial(self._recent.finished, p["b_call_id"], p["output_ids"]))

    @staticmethod
    def _finish_params(call_id: str, result: CallResult) -> dict[str, Any]:
        if result.status not in CALL_STATUSES or result.status == "in_flight":
            allowed = ", ".join(repr(s) for s in CALL_STATUSES if s != "in_flight")
            raise ValueError(f"Unknown final call status {result.status!r}. Must be one of {allowed}.")
        if result.output_logprobs and len(result.output_logprobs) != len(result.output_ids):
            raise ValueError(
                f"Call {call_id} has {len(result.output_ids)} output IDs but {len(result.output_logprobs)} "
                "logprobs; give one logprob per sampled ID, or none."
            )
        output = pack_ids(result.output_ids)
        return {
            "b_call_id": call_id,
            "b_output_ids": output,
            "status": result.status,
            "error": result.error,
            "http_status": result.http_status,
            "response_body": result.response_body,
            "completion_json": None if result.completion is None else _dumps(result.completion),
            "output_ids": output,
            "output_logprobs": pack_logprobs(result.output_logprobs),
            "output_len": len(result.output_ids),
            "finish_reason": result.finish_reason,
            "weight_version": result.weight_version,
            "weight_version_first": result.weight_version_first,
            "weight_version_last": result.weight_version_last,
            "latency_ms": result.latency_ms,
            "ttft_ms": result.ttft_ms,
            "ended_at": result.ended_at or time.time(),
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
        }

    def _not_finished(self, call_id: str) -> StoreError:
        """The error for a finish that matched no row."""
        if self._exists(C, call_id):
            return StoreError(
                f"Call {call_id!r} is finished and later calls store their prompts as its tokens; "
                "its output IDs cannot change. Record a new call instead."
            )
        return NotFoundError(f"No call {call_id!r} to finish. Start it with begin_call first.")

    def mark_interrupted_calls(self) -> int:
        """Mark `in_flight` calls of episodes that are no longer running as `interrupted`; return how many."""
        ended = select(E.c.id).where(E.c.status != "running")
        with self._write() as conn:
            result = conn.execute(
                C.update()
                .where(and_(C.c.status == "in_flight", C.c.episode_id.in_(ended)))
                .values(
                    status="interrupted",
                    error=func.coalesce(C.c.error, "the recording process ended before the call finished"),
                )
            )
        return result.rowcount

    def get_call(self, call_id: str) -> Call:
        """The call with this ID (or unique ID prefix; `call_` may be left off), with its tokens rebuilt."""
        cid = self._resolve(C, call_id, CALL_PREFIX, "call", "polarproxy show EPISODE")
        with self._read() as conn:
            row = conn.execute(select(C).where(C.c.id == cid)).one()
        return call_from_row(row, Rebuilder(self._load_token_row), BodyRebuilder(self._load_body_row))

    def list_calls(self, episode_id: str) -> list[Call]:
        """The calls of one episode in sequence order."""
        return list(self.iter_calls([episode_id]))

    def iter_calls(
        self,
        episode_ids: Sequence[str] | None = None,
        status: str | None = None,
        *,
        where: EpisodeQuery | None = None,
        lazy_prompts: bool = False,
    ) -> Iterator[Call]:
        """Calls in (episode start time, seq) order with their token arrays rebuilt; optionally only some
        episodes (exact IDs, or those matching `where`) and one status. Reads in small batches, each its own
        short transaction.

        `lazy_prompts`: yield LazyPromptCalls (rebuild.py), whose prompt ID lists are built only when read
        (their lengths are known at once): for readers that need few of them, such as prefix merge."""
        if status is not None and status not in CALL_STATUSES:
            raise ValueError(
                f"Unknown call status {status!r}. Must be one of {', '.join(map(repr, CALL_STATUSES))}."
            )
        query = select(E.c.id).order_by(E.c.started_at, E.c.id)
        if where is not None:
            query = query.where(*where.conditions())
        if episode_ids is not None:
            wanted = list(dict.fromkeys(episode_ids))
            query = query.where(E.c.id.in_(wanted))
        with self._read() as conn:
            ordered = list(conn.execute(query).scalars())
        if episode_ids is not None and len(ordered) != len(wanted):
            missing = sorted(set(wanted) - set(ordered))
            raise NotFoundError(
                f"No episode {', '.join(map(repr, missing))}. Run `polarproxy ls` to list them."
            )
        rebuilder, bodies = Rebuilder(self._load_token_row), BodyRebuilder(self._load_body_row)
        for eid in ordered:
            last_seq = -1
            while True:
                batch = select(C).where(C.c.episode_id == eid, C.c.seq > last_seq)
                if status is not None:
                    batch = batch.where(C.c.status == status)
                with self._read() as conn:
                    rows = conn.execute(batch.order_by(C.c.seq).limit(_BATCH)).all()
                for row in rows:
                    yield call_from_row(row, rebuilder, bodies, lazy=lazy_prompts)
                if len(rows) < _BATCH:
                    break
                last_seq = rows[-1]._mapping["seq"]

    def _load_body_row(self, call_id: str) -> BodyRow:
        with self._read() as conn:
            row = conn.execute(select(*BODY_COLUMNS).where(C.c.id == call_id)).first()
        if row is None:
            raise StoreError(
                f"Call {call_id!r}, the base of another call's request body, is missing. "
                "The database is inconsistent."
            )
        return body_row(row)

    def _load_token_row(self, call_id: str) -> TokenRow:
        with self._read() as conn:
            row = conn.execute(select(*TOKEN_COLUMNS).where(C.c.id == call_id)).first()
        if row is None:
            raise StoreError(
                f"Call {call_id!r}, the prompt base of another call, is missing. The database is inconsistent."
            )
        return token_row(row)
