"""Episodes in the store: creating, ending, listing and finding them by ID or prefix (a mixin of `Store`, which
gives it `_write` and `_read`). Also the ID lookup by unique prefix that calls share (`_resolve`)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, get_args

import orjson
from sqlalchemy import Connection, Row, func, or_, select

from polarproxy.redact import REDACTED, redact_argv
from polarproxy.store import schema
from polarproxy.store.errors import AmbiguousIdError, NotFoundError, StoreError
from polarproxy.store.ids import EPISODE_PREFIX, new_episode_id
from polarproxy.store.query import EpisodeQuery
from polarproxy.store.records import Episode, EpisodeStart, EpisodeStatus
from polarproxy.store.storable import storable

log = logging.getLogger("polarproxy.store.store")

EPISODE_STATUSES: tuple[str, ...] = get_args(EpisodeStatus)

E = schema.episodes
C = schema.calls


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _redacted_command(command: list[str]) -> list[str]:
    out = redact_argv(command)
    if out != command:
        log.warning(
            "Secrets on an episode's command line reached the store unredacted; storing them as %s.", REDACTED
        )
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


MAX_STAGES = 16
_NEWEST = re.compile(r"^@([0-9]{1,9})$")


def valid_stages(stages: Mapping[str, object]) -> dict[str, float]:
    """Stage name -> seconds (a finite number >= 0); ValueError naming the bad entry."""
    if len(stages) > MAX_STAGES:
        raise ValueError(f"{len(stages)} stages given; at most {MAX_STAGES}.")
    out = {}
    for name, seconds in stages.items():
        if not isinstance(name, str) or not name or len(name) > 64:
            raise ValueError(f"Stage name {name!r} must be a non-empty string of at most 64 characters.")
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not 0 <= seconds < float("inf")
        ):
            raise ValueError(
                f"Stage {name!r}: {seconds!r} is not a number of seconds (a finite number >= 0)."
            )
        out[name] = float(seconds)
    return out


def _like_prefix(prefix: str) -> str:
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


class EpisodesMixin:
    """Episode writes and reads, and ID lookups; `Store` provides the transactions."""

    if TYPE_CHECKING:  # provided by Store
        dialect: str

        def _write(self) -> AbstractContextManager[Connection]: ...

        def _read(self) -> AbstractContextManager[Connection]: ...

    def create_episode(
        self, start: EpisodeStart, *, episode_id: str | None = None, exist_ok: bool = False
    ) -> str:
        """Insert a `running` episode and return its ID (a new time-ordered one unless given).

        With a given `episode_id` that already exists: `exist_ok=True` returns it unchanged (an atomic
        "ensure"), otherwise StoreError."""
        values = {
            "command_json": _dumps(_redacted_command(list(start.command))),
            "harness": storable(start.harness, self.dialect),
            "cwd": storable(start.cwd, self.dialect),
            "task": storable(start.task, self.dialect),
            "group_id": storable(start.group_id, self.dialect),
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

    def finish_episode(
        self,
        episode_id: str,
        *,
        status: EpisodeStatus,
        exit_code: int | None = None,
        stages: Mapping[str, float] | None = None,
    ) -> None:
        """Record how the episode ended (status, the harness's exit code), when, and with `stages` the seconds
        each rollout stage took."""
        if status not in EPISODE_STATUSES:
            raise ValueError(
                f"Unknown episode status {status!r}. Must be one of {', '.join(map(repr, EPISODE_STATUSES))}."
            )
        with self._write() as conn:
            result = conn.execute(
                E.update()
                .where(E.c.id == episode_id)
                .values(
                    status=status,
                    exit_code=exit_code,
                    ended_at=time.time(),
                    **({"stages_json": orjson.dumps(valid_stages(stages)).decode()} if stages else {}),
                )
            )
        if result.rowcount == 0:
            raise NotFoundError(f"No episode {episode_id!r}.")

    def list_episodes(
        self,
        limit: int | None = 50,
        offset: int = 0,
        *,
        where: EpisodeQuery | None = None,
        counts: bool = True,
    ) -> list[Episode]:
        """Episodes, newest first, with their call and token counts. `limit=None` returns all; `where`
        keeps only the episodes that match it (task, group, status, harness, start time, reward).
        `counts=False` leaves the counts out (`calls` and `tokens` None): the token count reads every call's
        row, as much as an export of the 8k-token shape spends on 5 % of its work (docs/benchmarks-history.md)."""
        query = self._episode_query(counts=counts)
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
        """The episode with this ID, or whose ID alone starts with this prefix (`ep_` may be left off), or
        `@N`: the N-th newest (`@1` the latest, as `polarproxy ls` lists them; `@` is never in an ID)."""
        newest = _NEWEST.match(id_or_prefix.strip())
        if newest:
            eid = self._nth_newest(int(newest.group(1)))
        else:
            eid = self._resolve(E, id_or_prefix, EPISODE_PREFIX, "episode", "polarproxy ls")
        with self._read() as conn:
            row = conn.execute(self._episode_query().where(E.c.id == eid)).one()
        return self._episode(row)

    def _nth_newest(self, n: int) -> str:
        if n < 1:
            raise NotFoundError(f"No episode @{n}: @1 is the latest episode, @2 the one before, and so on.")
        query = select(E.c.id).order_by(E.c.started_at.desc(), E.c.id.desc()).offset(n - 1).limit(1)
        with self._read() as conn:
            eid = conn.execute(query).scalar()
        if eid is None:
            held = self.count_episodes()
            raise NotFoundError(
                f"No episode @{n}: the store holds {held} episode{'s' if held != 1 else ''}. "
                "Run `polarproxy ls` to list them."
            )
        return str(eid)

    @staticmethod
    def _episode_query(*, counts: bool = True) -> Any:
        if not counts:
            return select(E)
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
            calls=int(m["calls"]) if "calls" in m else None,
            tokens=int(m["tokens"]) if "tokens" in m else None,
            stages=orjson.loads(m["stages_json"]) if m.get("stages_json") else None,
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
