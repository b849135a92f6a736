"""Reading calls back: one by ID, an episode's, or many in order, with their token arrays and bodies rebuilt
from the calls they are stored against (a mixin of `Store`, which gives it `_read`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, get_args

from sqlalchemy import Connection, func, select

from polarproxy.store import schema
from polarproxy.store.call_rows import call_from_row
from polarproxy.store.errors import NotFoundError, StoreError
from polarproxy.store.ids import CALL_PREFIX
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
from polarproxy.store.records import Call, CallStatus

CALL_STATUSES: tuple[str, ...] = get_args(CallStatus)
_BATCH = 64  # calls read per transaction by iter_calls

E = schema.episodes
C = schema.calls


class CallReadsMixin:
    """Call reads; `Store` provides the transactions and `_resolve` (episodes.py)."""

    if TYPE_CHECKING:  # provided by Store and EpisodesMixin

        def _read(self) -> AbstractContextManager[Connection]: ...

        def _resolve(self, table: Any, id_or_prefix: str, prefix: str, what: str, hint: str) -> str: ...

    def get_call(self, call_id: str) -> Call:
        """The call with this ID (or unique ID prefix; `call_` may be left off), with its tokens rebuilt."""
        cid = self._resolve(C, call_id, CALL_PREFIX, "call", "polarproxy show EPISODE")
        with self._read() as conn:
            row = conn.execute(select(C).where(C.c.id == cid)).one()
        return call_from_row(row, Rebuilder(self._load_token_row), BodyRebuilder(self._load_body_row))

    def call_statuses(self, episode_id: str) -> dict[str, int]:
        """How many of the episode's calls have each status, by status name (statuses with none are left
        out): one query, no tokens rebuilt, for summaries and waits that only count."""
        query = (
            select(C.c.status, func.count())
            .where(C.c.episode_id == episode_id)
            .group_by(C.c.status)
            .order_by(C.c.status)  # the same order on every backend
        )
        with self._read() as conn:
            return {status: int(n) for status, n in conn.execute(query)}

    def answered_calls(self, episode_ids: Sequence[str]) -> dict[str, int]:
        """How many calls of each episode the model answered (status ok); episodes with none are left out.
        One grouped query per 500 episodes, no tokens read."""
        out: dict[str, int] = {}
        ids = list(dict.fromkeys(episode_ids))
        with self._read() as conn:
            for i in range(0, len(ids), 500):
                query = (
                    select(C.c.episode_id, func.count())
                    .where(C.c.episode_id.in_(ids[i : i + 500]), C.c.status == "ok")
                    .group_by(C.c.episode_id)
                )
                out.update({eid: int(n) for eid, n in conn.execute(query)})
        return out

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
