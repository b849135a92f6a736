"""Writing calls: `begin_call` (the in-flight row), `finish_call` (how it ended), and `write_calls`, which does
both for a writer's whole group commit in a fixed number of statements (a mixin of `Store`, which gives it
`_write`, `_after_commit`, `_read` and the `RecentCalls` of bases.py).

A group of begins is three statements whatever its size: one UPDATE hands out the sequence numbers
of every episode in it (`next_seq + n ... RETURNING`), one SELECT checks the prompt bases chosen before the
transaction (share-locked on PostgreSQL, so their outputs cannot change until the commit), and one
executemany INSERTs the rows. A group of finishes is one executemany UPDATE. Everything is committed once,
by the caller's transaction (or `Store.batch`), before any of it is reported done (T6).

The statements are plain SQL for SQLite and PostgreSQL, written once and run through `exec_driver_sql` with
positional parameters as the driver takes them (bool, int, float, str, bytes): no statement is compiled and
no parameter is processed per call. Errors still come back as SQLAlchemy's exceptions (so `spool.is_unavailable`
and the connection pool see them as before).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, get_args

import orjson
from sqlalchemy import Connection, and_, func, select

from polarproxy.redact import REDACTED, redact_headers, redact_path
from polarproxy.store import schema, textdelta
from polarproxy.store.arrays import pack_ids, pack_logprobs
from polarproxy.store.bases import Base, Known, RecentCalls, choose_base
from polarproxy.store.errors import NotFoundError, StoreError
from polarproxy.store.ids import new_call_id
from polarproxy.store.rebuild import BodyRebuilder, BodyRow, Rebuilder, TokenRow
from polarproxy.store.records import CallResult, CallStart, CallStatus
from polarproxy.store.storable import storable

log = logging.getLogger("polarproxy.store.store")

CALL_STATUSES: tuple[str, ...] = get_args(CallStatus)
MIN_REFERENCE_TOKENS = 8  # shorter prompts are always stored whole

E = schema.episodes
C = schema.calls

# The columns a begin writes (others keep their defaults), and those a finish sets.
BEGIN_COLUMNS = (
    "id",
    "episode_id",
    "seq",
    "dialect",
    "method",
    "path",
    "model",
    "stream",
    "status",
    "request_headers_json",
    "request_body",
    "conversation_json",
    "bodies_delta",
    "prompt_base_call_id",
    "prompt_base_len",
    "prompt_tail_ids",
    "prompt_len",
    "output_ids",
    "output_logprobs",
    "output_len",
    "backend",
    "backend_kind",
    "fidelity",
    "render_mode",
    "extended_from",
    "render_note",
    "started_at",
    "temperature",
    "logprob_temperature",
    "top_p",
    "top_k",
)
FINISH_COLUMNS = (
    "status",
    "error",
    "http_status",
    "response_body",
    "completion_json",
    "output_ids",
    "output_logprobs",
    "output_len",
    "finish_reason",
    "weight_version",
    "weight_version_first",
    "weight_version_last",
    "latency_ms",
    "ttft_ms",
    "ended_at",
    "prompt_tokens",
    "completion_tokens",
)


def in_order(values: dict[str, Any], columns: tuple[str, ...]) -> list[Any]:
    """`values`, named by column, as the positional row the statements take (`columns`' order); a name
    missing or one too many is refused here rather than shifting every value after it."""
    if len(values) != len(columns):  # equal lengths: a name left out is also one missing, a KeyError below
        raise KeyError(f"row names {sorted(values)} do not match the columns {list(columns)}")
    return [values[c] for c in columns]


@dataclass(frozen=True, slots=True)
class _Statements:
    next_seqs: str  # episodes' next_seq += n, RETURNING (id, next_seq)
    bases: str  # (id, episode_id, prompt_len, output_len) of some calls
    insert: str  # one call row, BEGIN_COLUMNS
    finish: str  # FINISH_COLUMNS, then the call ID and the output IDs of the condition

    def seq_params(self, counts: Counter[str]) -> tuple[Any, ...]:
        raise NotImplementedError

    def id_params(self, ids: list[str]) -> tuple[Any, ...]:
        raise NotImplementedError


# SET the finish columns. A finished call whose output later calls use as part of their prompt keeps that
# output: finishing it again is allowed only with the same output IDs (a replay), else no row matches.
_FINISH_TAIL = (
    " WHERE id = {p} AND (status = 'in_flight' OR output_ids = {p} OR NOT EXISTS (SELECT 1 FROM calls AS later"
    " WHERE later.prompt_base_call_id = calls.id AND later.prompt_base_len > calls.prompt_len))"
)


def _common(p: str) -> dict[str, str]:
    return {
        "insert": f"INSERT INTO calls ({', '.join(BEGIN_COLUMNS)}) VALUES ({', '.join([p] * len(BEGIN_COLUMNS))})",
        "finish": f"UPDATE calls SET {', '.join(f'{c} = {p}' for c in FINISH_COLUMNS)}"
        + _FINISH_TAIL.format(p=p),
    }


class _SqliteStatements(_Statements):
    def seq_params(self, counts: Counter[str]) -> tuple[Any, ...]:
        return (orjson.dumps(list(counts.items())).decode(),)

    def id_params(self, ids: list[str]) -> tuple[Any, ...]:
        return (orjson.dumps(ids).decode(),)


class _PostgresStatements(_Statements):
    def seq_params(self, counts: Counter[str]) -> tuple[Any, ...]:
        return (list(counts), list(counts.values()))

    def id_params(self, ids: list[str]) -> tuple[Any, ...]:
        return (ids,)


# SQLite (3.35+): JSON arrays as parameters; the caller holds the database's write lock (BEGIN IMMEDIATE).
_SQLITE = _SqliteStatements(
    next_seqs="UPDATE episodes SET next_seq = next_seq + json_extract(j.value, '$[1]') FROM json_each(?) AS j"
    " WHERE episodes.id = json_extract(j.value, '$[0]') RETURNING episodes.id, episodes.next_seq",
    bases="SELECT id, episode_id, prompt_len, output_len FROM calls WHERE id IN (SELECT value FROM json_each(?))",
    **_common("?"),
)
# PostgreSQL: arrays as parameters; UPDATE locks only the episodes' rows; the bases are share-locked.
_POSTGRES = _PostgresStatements(
    next_seqs="UPDATE episodes AS e SET next_seq = e.next_seq + v.n FROM unnest(%s::text[], %s::int[]) AS v(id, n)"
    " WHERE e.id = v.id RETURNING e.id, e.next_seq",
    bases="SELECT id, episode_id, prompt_len, output_len FROM calls WHERE id = ANY(%s) FOR SHARE",
    **_common("%s"),
)


def _statements(conn: Connection) -> _Statements:
    name = conn.dialect.name
    if name == "sqlite":
        return _SQLITE
    if name == "postgresql":
        return _POSTGRES
    raise StoreError(
        f"Cannot write calls to a {name} database. polarproxy stores calls in SQLite or PostgreSQL."
    )


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


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


def _bodies_delta(base: Known, bodies: tuple[str, str | None]) -> bytes | None:
    """The request body and conversation as compressed edits of the base call's, or None (stored whole)
    when that is not smaller."""
    delta = textdelta.encode(base.bodies, bodies)
    return delta if len(delta) < len(bodies[0]) + len(bodies[1] or "") else None


def _temperature(start: CallStart, conversation: dict[str, Any] | None) -> float | None:
    if start.temperature is not None:
        return float(start.temperature)
    value = ((conversation or {}).get("sampling") or {}).get("temperature")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(slots=True)
class _Begin:
    """A begin prepared before its transaction: the row (seq and base still to be filled in)."""

    call_id: str
    episode_id: str
    prompt: bytes
    bodies: tuple[str, str | None]
    base: Base | None
    delta: bytes | None
    row: list[Any]  # BEGIN_COLUMNS; never changed (copied when written, so a group can be written again)


@dataclass(frozen=True, slots=True)
class PreparedCalls:
    """A group of begins and finishes made ready outside any transaction (`prepare_calls`)."""

    begins: list[_Begin]
    finishes: list[tuple[Any, ...]]  # _finish_row's


_SEQ = BEGIN_COLUMNS.index("seq")
_BASE_ID, _BASE_LEN, _TAIL = (
    BEGIN_COLUMNS.index(c) for c in ("prompt_base_call_id", "prompt_base_len", "prompt_tail_ids")
)
_BODY, _CONVERSATION, _DELTA = (
    BEGIN_COLUMNS.index(c) for c in ("request_body", "conversation_json", "bodies_delta")
)


def _finish_row(call_id: str, result: CallResult, dialect: str) -> tuple[Any, ...]:
    """FINISH_COLUMNS, then the call ID and the output IDs again (the statement's condition), as `dialect`'s
    columns hold them (storable.py)."""
    if result.status not in CALL_STATUSES or result.status == "in_flight":
        allowed = ", ".join(repr(s) for s in CALL_STATUSES if s != "in_flight")
        raise ValueError(f"Unknown final call status {result.status!r}. Must be one of {allowed}.")
    if result.output_logprobs and len(result.output_logprobs) != len(result.output_ids):
        raise ValueError(
            f"Call {call_id} has {len(result.output_ids)} output IDs but {len(result.output_logprobs)} "
            "logprobs; give one logprob per sampled ID, or none."
        )
    output = pack_ids(result.output_ids)
    values = {
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
    row = (*in_order(values, FINISH_COLUMNS), call_id, output)
    return tuple(storable(v, dialect) for v in row)


class CallWritesMixin:
    """Call writes; `Store` provides the transactions, `_recent` and `_exists` (episodes.py)."""

    if TYPE_CHECKING:  # provided by Store, EpisodesMixin and CallReadsMixin
        _recent: RecentCalls
        dialect: str

        def _write(self) -> AbstractContextManager[Connection]: ...

        def _read(self) -> AbstractContextManager[Connection]: ...

        def _after_commit(self, fn: Callable[[], None]) -> None: ...

        def _exists(self, table: Any, id_: str) -> bool: ...

        def _load_token_row(self, call_id: str) -> TokenRow: ...

        def _load_body_row(self, call_id: str) -> BodyRow: ...

    def begin_call(self, start: CallStart, *, call_id: str | None = None) -> tuple[str, int]:
        """Insert an `in_flight` call and return (call_id, seq); it is on disk when this returns.

        `call_id` (the spool): an ID made by the caller with `new_call_id()`, so that a call
        spooled while the database was down keeps its ID when it is replayed; default a new one.

        Defensively (the capture layer redacts first) secret headers and query parameters that arrive
        unredacted are stored as `<redacted>`.

        The prompt is stored as a verified reference to an earlier call of the episode plus the tokens it
        adds, when one shares a prefix with it (bases.py); else whole."""
        return self.write_calls([(call_id, start)])[0]

    def finish_call(self, call_id: str, result: CallResult) -> None:
        """Record how a call ended; on disk when this returns."""
        self.write_calls((), [(call_id, result)])

    def finish_calls(self, results: Sequence[tuple[str, CallResult]]) -> None:
        """`finish_call` for several calls in one transaction and one executemany (the writer thread's group
        commit: one statement for a run of finishes). All or none: if one cannot be finished, nothing is
        written (inside a `batch`, the batch fails) and its error is raised."""
        self.write_calls((), results)

    def write_calls(
        self,
        begins: Sequence[tuple[str | None, CallStart]],
        finishes: Sequence[tuple[str, CallResult]] = (),
    ) -> list[tuple[str, int]]:
        """`begin_call` for each of `begins` (in order: calls of one episode get consecutive sequence numbers),
        then `finish_call` for each of `finishes`, in one transaction of at most four statements; returns
        the begun calls' (call_id, seq). All or none: if one write fails, nothing is written (inside a
        `batch`, the batch fails) and its error is raised."""
        return self.write_prepared(self.prepare_calls(begins, finishes))

    def prepare_calls(
        self,
        begins: Sequence[tuple[str | None, CallStart]],
        finishes: Sequence[tuple[str, CallResult]] = (),
    ) -> PreparedCalls:
        """The Python half of `write_calls`, done before any transaction opens: packed prompts and outputs,
        JSON, the prompt bases chosen and the body edits. A writer that groups several runs into one `batch`
        prepares them all first, so that the write lock (SQLite's is the whole file's, from `BEGIN
        IMMEDIATE`) is held only for the statements. Raises what a bad write would (ValueError)."""
        return PreparedCalls(
            [self._prepare_begin(start, call_id or new_call_id()) for call_id, start in begins],
            [_finish_row(call_id, result, self.dialect) for call_id, result in finishes],
        )

    def write_prepared(self, prepared: PreparedCalls) -> list[tuple[str, int]]:
        """Write what `prepare_calls` made, as `write_calls` does. A prepared group may be written again
        after its transaction failed (its rows are copied, never changed)."""
        if not prepared.begins and not prepared.finishes:
            return []
        with self._write() as conn:
            sql = _statements(conn)
            seqs = self._insert_begins(conn, sql, prepared.begins) if prepared.begins else []
            if prepared.finishes:
                self._update_finishes(conn, sql, prepared.finishes)
        return [(b.call_id, seq) for b, seq in zip(prepared.begins, seqs, strict=True)]

    def _prepare_begin(self, start: CallStart, call_id: str) -> _Begin:
        """Everything a begin needs outside the transaction: packed prompt, JSON, the base and body edits."""
        prompt = pack_ids(start.prompt_ids)
        body = storable(start.request_body, self.dialect)  # as stored, and so as a later call's base
        conversation = start.conversation_dict()
        bodies = (body, None if conversation is None else _dumps(conversation))
        chosen = self._choose_base(start, prompt)
        base, delta = (None, None) if chosen is None else (chosen[0], _bodies_delta(chosen[1], bodies))
        values = {
            "id": call_id,
            "episode_id": start.episode_id,
            "seq": None,  # given in the transaction
            "dialect": start.dialect,
            "method": start.method,
            "path": _redacted_path(start.path),
            "model": start.model,
            "stream": bool(start.stream),
            "status": "in_flight",
            "request_headers_json": _dumps(_redacted_headers(start.request_headers)),
            "request_body": bodies[0],
            "conversation_json": bodies[1],
            "bodies_delta": None,  # set when a base is chosen
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
            "temperature": _temperature(start, conversation),
            "logprob_temperature": start.logprob_temperature,
            "top_p": start.top_p,
            "top_k": start.top_k,
        }
        row = in_order(values, BEGIN_COLUMNS)
        if self.dialect == "postgresql":  # a model name or a note may hold a NUL
            row = [storable(v, self.dialect) for v in row]
        return _Begin(call_id, start.episode_id, prompt, bodies, base, delta, row)

    def _insert_begins(self, conn: Connection, sql: _Statements, begins: list[_Begin]) -> list[int]:
        counts = Counter(b.episode_id for b in begins)
        next_seq = dict(conn.exec_driver_sql(sql.next_seqs, sql.seq_params(counts)).all())
        for b in begins:
            if b.episode_id not in next_seq:
                raise NotFoundError(
                    f"No episode {b.episode_id!r} to add a call to. Create it with create_episode first."
                )
        seq = {eid: next_seq[eid] - n for eid, n in counts.items()}  # the first of each episode's
        bases = [b.base.call_id for b in begins if b.base is not None]
        rows = {} if not bases else {r[0]: r for r in conn.exec_driver_sql(sql.bases, sql.id_params(bases))}
        out: list[tuple[Any, ...]] = []
        for b in begins:
            row = list(b.row)
            row[_SEQ] = seq[b.episode_id]
            seq[b.episode_id] += 1
            if b.base is not None and _base_holds(rows.get(b.base.call_id), b.base, b.episode_id):
                row[_BASE_ID], row[_BASE_LEN] = b.base.call_id, b.base.length
                row[_TAIL] = b.prompt[4 * b.base.length :]
                if b.delta is not None:  # the bodies as edits of the base's (textdelta.py)
                    row[_BODY], row[_CONVERSATION], row[_DELTA] = "", None, b.delta
            out.append(tuple(row))
        conn.exec_driver_sql(sql.insert, out)
        for b in begins:
            self._after_commit(partial(self._recent.began, b.episode_id, b.call_id, b.prompt, b.bodies))
        return [row[_SEQ] for row in out]

    def _update_finishes(self, conn: Connection, sql: _Statements, finished: list[tuple[Any, ...]]) -> None:
        if conn.exec_driver_sql(sql.finish, finished).rowcount != len(finished):
            for row in finished:  # find the one that matched no row (finishing again is a no-op: a replay)
                if conn.exec_driver_sql(sql.finish, row).rowcount == 0:
                    raise self._not_finished(row[-2])
        for row in finished:
            self._after_commit(partial(self._recent.finished, row[-2], row[-1]))

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


def _base_holds(row: Any, base: Base, episode_id: str) -> bool:
    """Inside the write transaction: the base is still the call of this episode whose tokens were compared
    (on PostgreSQL its row is share-locked until commit, so its output cannot change)."""
    if row is None or row[1] != episode_id or row[2] != base.prompt_len:
        return False
    if base.length <= row[2]:
        return True
    return base.output_len is not None and row[3] == base.output_len
