"""What every recording proxy starts with, in gateway and intercept mode: a store that takes writes, and the
episode its calls go to.

The store is checked before anything runs: a database that cannot be opened, or that opens but refuses
writes (a read-only file or mount, a read-only PostgreSQL transaction or standby), is an `Error:` and the
harness is not started, so no episode is left half in a spool for a database that will never take it. (An
outage that begins later is the spool's to bridge: store/spool.py.)
"""

from __future__ import annotations

import os

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from polarproxy.errors import UsageError
from polarproxy.redact import redact_argv
from polarproxy.store.records import EpisodeStart
from polarproxy.store.schema import episodes
from polarproxy.store.store import Store
from polarproxy.store.urls import display_url
from polarproxy.store.writer import StoreWriter

STORE_HINT = "Pass --db PATH to a writable file, or set POLARPROXY_DB."


def write_problem(store: Store) -> str | None:
    """Why the database refuses writes, or None. The probe is an UPDATE that matches no row: it takes the
    write lock (SQLite) or a read-write transaction (PostgreSQL) and changes nothing."""
    try:
        with store.engine.begin() as conn:
            conn.execute(episodes.update().where(sa.false()).values(status=episodes.c.status))
    except SQLAlchemyError as e:
        return str(getattr(e, "orig", None) or e).strip()
    return None


def open_recording_store(db: str | None) -> Store:
    """The store a recording writes to; UsageError (nothing has run yet) when it cannot be opened or
    does not take writes."""
    shown = display_url(db) if db else "default"
    try:
        store = Store.open(db)
    except Exception as e:
        raise UsageError(f"Cannot open the store '{shown}': {e}", hint=STORE_HINT) from e
    problem = write_problem(store)
    if problem is not None:
        store.close()
        raise UsageError(
            f"The store '{shown}' does not take writes ({problem}); the harness was not started.",
            hint="Make the database writable (a read-only file or mount, or a read-only PostgreSQL server, "
            f"refuses writes), or record elsewhere. {STORE_HINT}",
        )
    return store


async def create_recorded_episode(
    writer: StoreWriter,
    command: list[str],
    *,
    harness: str | None,
    task: str | None,
    group_id: str | None,
    metadata: dict[str, str],
) -> str:
    """The episode a recording's calls go to (its command redacted, T5), in the current folder."""
    return await writer.create_episode(recorded_episode_start(command, harness, task, group_id, metadata))


def recorded_episode_start(
    command: list[str], harness: str | None, task: str | None, group_id: str | None, metadata: dict[str, str]
) -> EpisodeStart:
    """What a recording's episode starts with: its command redacted (T5), the current folder."""
    return EpisodeStart(
        command=redact_argv(command),  # T5: keys on the harness's command line are never stored
        harness=harness,
        cwd=os.getcwd(),
        task=task,
        group_id=group_id,
        metadata=metadata,
    )
