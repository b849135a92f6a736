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
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, get_args

import orjson
from sqlalchemy import Connection, Engine, Row, and_, bindparam, func, or_, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, IntegrityError, SQLAlchemyError

from polarproxy.redact import REDACTED, redact_headers, redact_path
from polarproxy.store import schema
from polarproxy.store.arrays import pack_ids, pack_logprobs, unpack_ids, unpack_logprobs
from polarproxy.store.engine import is_sqlite_memory, make_engine, read_transaction, write_transaction
from polarproxy.store.errors import AmbiguousIdError, NotFoundError, StoreError
from polarproxy.store.ids import CALL_PREFIX, EPISODE_PREFIX, new_call_id, new_episode_id
from polarproxy.store.migrations import migrate
from polarproxy.store.rebuild import TOKEN_COLUMNS, Rebuilder, TokenRow, token_row
from polarproxy.store.records import (
    Call,
    CallResult,
    CallStart,
    CallStatus,
    Episode,
    EpisodeStart,
    EpisodeStatus,
)

log = logging.getLogger(__name__)

CALL_STATUSES: tuple[str, ...] = get_args(CallStatus)
EPISODE_STATUSES: tuple[str, ...] = get_args(EpisodeStatus)
_BATCH = 64  # calls read per transaction by iter_calls

E = schema.episodes
C = schema.calls

# Hot-path statements, built once; values are passed as parameters (no per-call statement construction).
_NEXT_SEQ = (
    E.update()
    .where(E.c.id == bindparam("b_episode_id"))
    .values(next_seq=E.c.next_seq + 1)
    .returning(E.c.next_seq)
)
_INSERT_CALL = C.insert()
_FINISH_CALL = C.update().where(C.c.id == bindparam("b_call_id"))  # SET: the parameters given


def default_db_url() -> str:
    """`$POLARPROXY_DB` (a path or a URL) if set, else `$XDG_DATA_HOME/polarproxy/polarproxy.db`
    (`~/.local/share/polarproxy/polarproxy.db` without XDG_DATA_HOME)."""
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


def _redacted_path(path: str) -> str:
    out = redact_path(path)
    if out != path:
        log.warning("Secret query parameters reached the store unredacted; storing them as %s.", REDACTED)
    return out


def _like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class Store:
    """Episodes and calls. Open with `Store.open(url_or_path)`; close with `close()` or a `with` block."""

    def __init__(self, engine: Engine, *, url: str):
        self.engine = engine
        self.url = url
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
        `:memory:` is a private in-memory SQLite database.
        """
        target = default_db_url() if url is None else os.fspath(url)
        if target == ":memory:":
            sa_url = "sqlite://"
        elif "://" in target:
            sa_url = target
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
        shown = sa_url
        try:
            shown = make_url(sa_url).render_as_string(hide_password=True)
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
                f"Cannot open the database {target if '://' not in target else shown}: {reason}. "
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
        with self._write() as conn:
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
        try:
            with self._lock, write_transaction(self.engine) as conn:
                yield conn
        except IntegrityError:
            raise
        except SQLAlchemyError as exc:
            raise self._error("write to", exc) from exc

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        try:
            with self._lock, read_transaction(self.engine) as conn:
                yield conn
        except SQLAlchemyError as exc:
            raise self._error("read", exc) from exc

    def _error(self, verb: str, exc: SQLAlchemyError) -> StoreError:
        shown = make_url(self.url).render_as_string(hide_password=True)
        reason = getattr(exc, "orig", None) or exc
        return StoreError(
            f"Cannot {verb} the database {shown}: {reason}. Check free disk space and that no other "
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
            "command_json": _dumps(list(start.command)),
            "harness": start.harness,
            "cwd": start.cwd,
            "task": start.task,
            "group_id": start.group_id,
            "status": "running",
            "started_at": time.time(),
            "metadata_json": _dumps(start.metadata),
            "next_seq": 0,
        }
        for attempt in range(3):
            eid = episode_id or new_episode_id()
            try:
                with self._write() as conn:
                    conn.execute(E.insert().values(id=eid, **values))
                return eid
            except IntegrityError as exc:
                if episode_id is not None and exist_ok and self._exists(E, episode_id):
                    return episode_id
                if episode_id is not None or attempt == 2:
                    raise StoreError(
                        f"Cannot create episode {eid!r}: an episode with that ID exists."
                    ) from exc
        raise AssertionError("unreachable")

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

    def set_reward(self, episode_id: str, reward: float | None) -> None:
        """Set (or clear, with None) the episode's reward."""
        with self._write() as conn:
            result = conn.execute(E.update().where(E.c.id == episode_id).values(reward=reward))
        if result.rowcount == 0:
            raise NotFoundError(f"No episode {episode_id!r}.")

    def list_episodes(self, limit: int | None = 50, offset: int = 0) -> list[Episode]:
        """Episodes, newest first, with their call and token counts. `limit=None` returns all."""
        query = self._episode_query().order_by(E.c.started_at.desc(), E.c.id.desc()).offset(offset)
        if limit is not None:
            query = query.limit(limit)
        with self._read() as conn:
            return [self._episode(row) for row in conn.execute(query)]

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

    def begin_call(self, start: CallStart) -> tuple[str, int]:
        """Insert an `in_flight` call and return (call_id, seq); it is on disk when this returns.

        Defensively (the capture layer redacts first) secret headers and query parameters that arrive
        unredacted are stored as `<redacted>`."""
        prompt = pack_ids(start.prompt_ids)
        values = {
            "episode_id": start.episode_id,
            "dialect": start.dialect,
            "method": start.method,
            "path": _redacted_path(start.path),
            "model": start.model,
            "stream": bool(start.stream),
            "status": "in_flight",
            "request_headers_json": _dumps(_redacted_headers(start.request_headers)),
            "request_body": start.request_body,
            "conversation_json": None if start.conversation is None else _dumps(start.conversation),
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
        }
        call_id = new_call_id()
        with self._write() as conn:
            next_seq = conn.execute(_NEXT_SEQ, {"b_episode_id": start.episode_id}).scalar_one_or_none()
            if next_seq is None:
                raise NotFoundError(
                    f"No episode {start.episode_id!r} to add a call to. Create it with create_episode first."
                )
            seq = next_seq - 1
            conn.execute(_INSERT_CALL, {"id": call_id, "seq": seq, **values})
        return call_id, seq

    def finish_call(self, call_id: str, result: CallResult) -> None:
        """Record how a call ended; on disk when this returns."""
        if result.status not in CALL_STATUSES or result.status == "in_flight":
            allowed = ", ".join(repr(s) for s in CALL_STATUSES if s != "in_flight")
            raise ValueError(f"Unknown final call status {result.status!r}. Must be one of {allowed}.")
        if result.output_logprobs and len(result.output_logprobs) != len(result.output_ids):
            raise ValueError(
                f"Call {call_id} has {len(result.output_ids)} output IDs but {len(result.output_logprobs)} "
                "logprobs; give one logprob per sampled ID, or none."
            )
        values = {
            "status": result.status,
            "error": result.error,
            "http_status": result.http_status,
            "response_body": result.response_body,
            "completion_json": None if result.completion is None else _dumps(result.completion),
            "output_ids": pack_ids(result.output_ids),
            "output_logprobs": pack_logprobs(result.output_logprobs),
            "output_len": len(result.output_ids),
            "finish_reason": result.finish_reason,
            "weight_version": result.weight_version,
            "latency_ms": result.latency_ms,
            "ttft_ms": result.ttft_ms,
            "ended_at": result.ended_at or time.time(),
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": result.completion_tokens,
        }
        with self._write() as conn:
            updated = conn.execute(_FINISH_CALL, {"b_call_id": call_id, **values})
        if updated.rowcount == 0:
            raise NotFoundError(f"No call {call_id!r} to finish. Start it with begin_call first.")

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
        return self._call(row, Rebuilder(self._load_token_row))

    def list_calls(self, episode_id: str) -> list[Call]:
        """The calls of one episode in sequence order."""
        return list(self.iter_calls([episode_id]))

    def iter_calls(
        self, episode_ids: Sequence[str] | None = None, status: str | None = None
    ) -> Iterator[Call]:
        """Calls in (episode start time, seq) order with their token arrays rebuilt; optionally only some
        episodes (exact IDs) and one status. Reads in small batches, each its own short transaction."""
        if status is not None and status not in CALL_STATUSES:
            raise ValueError(
                f"Unknown call status {status!r}. Must be one of {', '.join(map(repr, CALL_STATUSES))}."
            )
        query = select(E.c.id).order_by(E.c.started_at, E.c.id)
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
        rebuilder = Rebuilder(self._load_token_row)
        for eid in ordered:
            last_seq = -1
            while True:
                batch = select(C).where(C.c.episode_id == eid, C.c.seq > last_seq)
                if status is not None:
                    batch = batch.where(C.c.status == status)
                with self._read() as conn:
                    rows = conn.execute(batch.order_by(C.c.seq).limit(_BATCH)).all()
                for row in rows:
                    yield self._call(row, rebuilder)
                if len(rows) < _BATCH:
                    break
                last_seq = rows[-1]._mapping["seq"]

    def _load_token_row(self, call_id: str) -> TokenRow:
        with self._read() as conn:
            row = conn.execute(select(*TOKEN_COLUMNS).where(C.c.id == call_id)).first()
        if row is None:
            raise StoreError(
                f"Call {call_id!r}, the prompt base of another call, is missing. The database is inconsistent."
            )
        return token_row(row)

    @staticmethod
    def _call(row: Row[Any], rebuilder: Rebuilder) -> Call:
        m = row._mapping
        return Call(
            id=m["id"],
            episode_id=m["episode_id"],
            seq=m["seq"],
            dialect=m["dialect"],
            method=m["method"],
            path=m["path"],
            model=m["model"],
            stream=bool(m["stream"]),
            status=m["status"],
            error=m["error"],
            http_status=m["http_status"],
            request_headers=orjson.loads(m["request_headers_json"]),
            request_body=m["request_body"],
            response_body=m["response_body"],
            conversation=_loads(m["conversation_json"]),
            completion=_loads(m["completion_json"]),
            prompt_ids=rebuilder.prompt(token_row(row)),
            output_ids=unpack_ids(m["output_ids"]),
            output_logprobs=unpack_logprobs(m["output_logprobs"]),
            finish_reason=m["finish_reason"],
            weight_version=m["weight_version"],
            backend=m["backend"],
            backend_kind=m["backend_kind"],
            fidelity=m["fidelity"],
            render_mode=m["render_mode"],
            extended_from=m["extended_from"],
            render_note=m["render_note"],
            started_at=m["started_at"],
            ended_at=m["ended_at"],
            latency_ms=m["latency_ms"],
            ttft_ms=m["ttft_ms"],
            prompt_tokens=m["prompt_tokens"],
            completion_tokens=m["completion_tokens"],
            reward=m["reward"],
        )
