"""Looking after a store: where it is, its state, repairs after crashes and outages, and deleting episodes.

Used by `polarproxy db path|status|migrate|repair`, `polarproxy rm` and `polarproxy prune`, and by every
proxy and command that opens a database (`recover`): a running episode whose recording process is gone
(owners.py) is ended as `interrupted`, and its in-flight calls too, with the reason in their `error`;
spools left by a writer that ended before it could replay them (spool.py) are replayed first.

Episodes are deleted whole, never in part: a call's prompt may be stored as a reference to an earlier call
of its episode (`prompt_base_call_id`), so a part of an episode could lose its tokens.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, delete, func, inspect, select

from polarproxy.store import owners, schema, spool
from polarproxy.store.engine import make_engine
from polarproxy.store.errors import StoreError
from polarproxy.store.migrations import MIGRATIONS, migrations_table
from polarproxy.store.urls import display_url, is_url, sqlalchemy_url

if TYPE_CHECKING:
    from polarproxy.store.store import Store

E = schema.episodes
C = schema.calls
W = schema.writers


def sa_url(target: str | None) -> str:
    """The SQLAlchemy URL `Store.open` would use for a path or URL (None: the default database)."""
    from polarproxy.store.store import default_db_url

    t = default_db_url() if target is None else os.fspath(target)
    if t == ":memory:":
        return "sqlite://"
    if is_url(t):
        return sqlalchemy_url(t).render_as_string(hide_password=False)
    return "sqlite:///" + str(Path(t).expanduser().resolve())


@dataclass
class Location:
    url: str  # password hidden
    backend: str  # 'sqlite' | 'postgresql' | ...
    path: str | None  # the SQLite file
    exists: bool | None  # for a file: whether it is there (None for servers)


def location(target: str | None) -> Location:
    """Where the database is (`polarproxy db path`); nothing is opened."""
    url = sa_url(target)
    backend = url.split(":", 1)[0].split("+", 1)[0]
    path = None
    exists = None
    if backend == "sqlite":
        path = url.removeprefix("sqlite:///") or ":memory:"
        exists = Path(path).is_file() if path != ":memory:" else None
    return Location(url=display_url(url), backend=backend, path=path, exists=exists)


# ---- migrations --------------------------------------------------------------------------------------------


def migration_state(target: str | None) -> tuple[list[str], list[str]]:
    """(applied, pending) migration names, read without changing the database."""
    engine = make_engine(sa_url(target))
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table(migrations_table.name):
                applied: list[str] = []
            else:
                rows = conn.execute(select(migrations_table.c.name).order_by(migrations_table.c.applied_at))
                applied = [name for (name,) in rows]
    finally:
        engine.dispose()
    done = set(applied)
    return applied, [fn.__name__ for fn in MIGRATIONS if fn.__name__ not in done]


# ---- repair ------------------------------------------------------------------------------------------------


@dataclass
class Interrupted:
    episode_id: str
    reason: str
    calls: int  # in-flight calls marked interrupted


@dataclass
class RepairReport:
    replayed_ops: int = 0
    replayed_calls: int = 0
    rejected_ops: int = 0
    replay_error: str | None = None  # the database stopped answering during the replay
    episodes: list[Interrupted] = field(default_factory=list)
    calls_of_ended_episodes: int = 0  # in-flight calls of episodes that had already ended

    @property
    def calls_interrupted(self) -> int:
        return sum(e.calls for e in self.episodes) + self.calls_of_ended_episodes

    def to_dict(self) -> dict[str, Any]:
        return {
            "replayed_ops": self.replayed_ops,
            "replayed_calls": self.replayed_calls,
            "rejected_ops": self.rejected_ops,
            "replay_error": self.replay_error,
            "episodes_interrupted": [e.__dict__ for e in self.episodes],
            "calls_interrupted": self.calls_interrupted,
        }


def dead_episodes(
    store: Store, *, stale_after: float = owners.STALE_AFTER_S, now: float | None = None
) -> list[tuple[str, str]]:
    """Running episodes whose recording process is gone: (episode ID, why)."""
    current = time.time() if now is None else now
    last_call = select(func.max(C.c.started_at)).where(C.c.episode_id == E.c.id).scalar_subquery()
    with store._read() as conn:
        running = conn.execute(
            select(E.c.id, E.c.writer_id, E.c.started_at, last_call.label("last_call")).where(
                E.c.status == "running"
            )
        ).all()
    writers = owners.writers(store) if running else {}
    verdicts: dict[str, tuple[bool, str]] = {}
    out = []
    for eid, wid, started, last in running:
        if wid is None:
            idle = current - max(started, last or 0.0)
            if idle > stale_after:
                out.append(
                    (
                        eid,
                        f"no recording process is known for it and nothing was written to it for "
                        f"{idle / 60:.0f} min (stale after {stale_after / 60:g} min)",
                    )
                )
            continue
        if wid not in verdicts:
            row = writers.get(wid)
            verdicts[wid] = (
                owners.is_alive(row, now=current, stale_after=stale_after)
                if row is not None
                else (False, f"its recording process ({wid}) left no record of itself")
            )
        alive, why = verdicts[wid]
        if not alive:
            out.append((eid, why))
    return out


def interrupt(
    store: Store, dead: Sequence[tuple[str, str]], *, now: float | None = None
) -> list[Interrupted]:
    """End these running episodes as `interrupted`, and mark their in-flight calls `interrupted` with why."""
    ended = time.time() if now is None else now
    out = []
    for eid, why in dead:
        with store._write() as conn:
            n = conn.execute(
                C.update()
                .where(and_(C.c.episode_id == eid, C.c.status == "in_flight"))
                .values(
                    status="interrupted",
                    error=f"interrupted: the call never finished because {why}",
                    ended_at=ended,
                )
            ).rowcount
            conn.execute(
                E.update()
                .where(and_(E.c.id == eid, E.c.status == "running"))
                .values(status="interrupted", ended_at=ended)
            )
        out.append(Interrupted(episode_id=eid, reason=why, calls=n))
    return out


def recover(store: Store, *, stale_after: float = owners.STALE_AFTER_S) -> RepairReport:
    """Replay orphaned spools, then end the episodes of dead writers and mark their in-flight calls."""
    report = RepairReport()
    replayed = spool.replay_orphans(store)
    report.replayed_ops, report.replayed_calls = replayed.ops, replayed.calls
    report.rejected_ops = replayed.rejected
    report.replay_error = replayed.error
    report.episodes = interrupt(store, dead_episodes(store, stale_after=stale_after))
    report.calls_of_ended_episodes = store.mark_interrupted_calls()
    return report


# ---- status ------------------------------------------------------------------------------------------------


def status(store: Store, *, stale_after: float = owners.STALE_AFTER_S) -> dict[str, Any]:
    """Counts by status, stale running episodes and the spool backlog (`polarproxy db status`)."""
    with store._read() as conn:
        episodes = dict(conn.execute(select(E.c.status, func.count()).group_by(E.c.status)).all())
        calls = dict(conn.execute(select(C.c.status, func.count()).group_by(C.c.status)).all())
    return {
        "episodes": {k: int(v) for k, v in sorted(episodes.items())},
        "calls": {k: int(v) for k, v in sorted(calls.items())},
        "stale_running_episodes": [
            {"id": eid, "reason": why} for eid, why in dead_episodes(store, stale_after=stale_after)
        ],
        "spool": [b.__dict__ for b in spool.pending(store.url)],
    }


# ---- deleting ----------------------------------------------------------------------------------------------


@dataclass
class Deletion:
    episodes: list[str]
    calls: int
    skipped_running: list[str] = field(default_factory=list)


def plan_prune(store: Store, before: float) -> Deletion:
    """Episodes started before `before` (Unix time); running ones are left alone."""
    with store._read() as conn:
        rows = conn.execute(
            select(E.c.id, E.c.status).where(E.c.started_at < before).order_by(E.c.started_at)
        ).all()
    ids = [eid for eid, st in rows if st != "running"]
    return Deletion(
        episodes=ids, calls=count_calls(store, ids), skipped_running=[e for e, st in rows if st == "running"]
    )


def count_calls(store: Store, episode_ids: Sequence[str]) -> int:
    total = 0
    with store._read() as conn:
        for chunk in _chunks(episode_ids):
            total += int(conn.execute(select(func.count()).where(C.c.episode_id.in_(chunk))).scalar_one())
    return total


def delete_episodes(store: Store, episode_ids: Sequence[str]) -> int:
    """Delete whole episodes (exact IDs) with all their calls, each in one transaction; return the calls
    deleted. Refuses, before deleting anything, if a call outside them is built on a call inside them."""
    ids = list(dict.fromkeys(episode_ids))
    with store._read() as conn:
        for chunk in _chunks(ids):
            inside = select(C.c.id).where(C.c.episode_id.in_(chunk))
            outside = conn.execute(
                select(C.c.id, C.c.episode_id)
                .where(and_(C.c.prompt_base_call_id.in_(inside), C.c.episode_id.not_in(ids)))
                .limit(1)
            ).first()
            if outside is not None:
                raise StoreError(
                    f"Cannot delete: call {outside[0]} of episode {outside[1]} stores its prompt as a reference "
                    "to a call of an episode being deleted. Delete that episode too."
                )
    deleted = 0
    for eid in ids:
        with store._write() as conn:
            # one statement for the episode's calls: references among them are checked at its end
            deleted += conn.execute(delete(C).where(C.c.episode_id == eid)).rowcount
            conn.execute(delete(schema.rewards).where(schema.rewards.c.episode_id == eid))
            conn.execute(delete(schema.episode_keys).where(schema.episode_keys.c.episode_id == eid))
            conn.execute(delete(schema.episode_finishes).where(schema.episode_finishes.c.episode_id == eid))
            conn.execute(delete(E).where(E.c.id == eid))
    return deleted


def _chunks(ids: Sequence[str], size: int = 500) -> list[Sequence[str]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)] or [[]]
