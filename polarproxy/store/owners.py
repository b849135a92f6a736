"""Who records a running episode: one `writers` row per recording process, kept fresh by a heartbeat.

A proxy (its `StoreWriter`) registers itself as a writer (a random token, the host name, the pid, the
process's start time and the machine it runs on) and names itself in `episodes.writer_id` of the episodes
it records. A running episode whose writer is gone is what a crash leaves behind; `is_alive` tells them
apart:

- a writer on this machine (same boot and pid namespace, so its pid means the same process here) is alive
  exactly while a process with its pid and its start time exists, whatever its heartbeat says;
- a writer elsewhere is alive while its heartbeat is younger than `stale_after` seconds.

An episode with no writer (recorded before the `writers` table existed) is judged by the time of its last
write. Times are Unix seconds.
"""

from __future__ import annotations

import functools
import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, or_, select

from polarproxy.store import schema

if TYPE_CHECKING:
    from polarproxy.store.store import Store

W = schema.writers
E = schema.episodes

HEARTBEAT_S = 30.0  # how often a writer refreshes its heartbeat
STALE_AFTER_S = 600.0  # a writer on another machine is taken for dead after this long without a heartbeat


@dataclass(frozen=True, slots=True)
class Identity:
    """One recording process (one `StoreWriter`)."""

    id: str  # random token: `w_` + 16 hex characters
    host: str
    pid: int
    machine: str | None  # boot ID + pid namespace: processes with the same value see the same pids
    proc_start: str | None  # the process's start time in clock ticks since boot (/proc/PID/stat)


def proc_start(pid: int) -> str | None:
    """The start time of process `pid` (clock ticks since boot), or None where /proc cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the command name in (...) may hold spaces and parentheses
    return fields[19] if len(fields) > 19 else None  # field 22 of the whole line


@functools.cache
def machine_id() -> str | None:
    """This machine as processes see it: its boot ID and the pid namespace (None off Linux)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        pidns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot}/{pidns}"


def new_identity() -> Identity:
    pid = os.getpid()
    return Identity(
        id="w_" + secrets.token_hex(8),
        host=socket.gethostname(),
        pid=pid,
        machine=machine_id(),
        proc_start=proc_start(pid),
    )


def _pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True


def is_alive(writer: dict[str, Any], *, now: float, stale_after: float) -> tuple[bool, str]:
    """Whether the writer (a `writers` row as a dict) still runs, and if not, why (for the record)."""
    where = f"pid {writer['pid']} on {writer['host']}"
    here = machine_id()
    if here is not None and writer.get("machine") == here:
        if not _pid_running(writer["pid"]):
            return False, f"its recording process ({where}) is gone"
        started = writer.get("proc_start")
        if started is not None and proc_start(writer["pid"]) not in (None, started):
            return False, f"its recording process ({where}) is gone (the pid now belongs to another process)"
        return True, ""
    age = now - float(writer["heartbeat_at"])
    if age > stale_after:
        return False, (
            f"its recording process ({where}) sent no heartbeat for {age / 60:.0f} min "
            f"(stale after {stale_after / 60:g} min)"
        )
    return True, ""


# ---- writes (each joins the caller's `store.batch()` when there is one) ------------------------------------


def heartbeat(store: Store, ident: Identity, *, now: float | None = None) -> None:
    """Register the writer, or refresh its heartbeat."""
    ts = time.time() if now is None else now
    with store._write() as conn:
        done = conn.execute(W.update().where(W.c.id == ident.id).values(heartbeat_at=ts)).rowcount
        if not done:
            conn.execute(
                W.insert().values(
                    id=ident.id,
                    host=ident.host,
                    pid=ident.pid,
                    machine=ident.machine,
                    proc_start=ident.proc_start,
                    started_at=ts,
                    heartbeat_at=ts,
                )
            )


def claim(store: Store, episode_id: str, writer_id: str, *, reopen: bool = False) -> None:
    """Name `writer_id` as the episode's writer unless another writer has it.

    With `reopen` (an episode named by a harness, `serve`), an episode that had ended is taken over and
    running again: its harness sent another call."""
    with store._write() as conn:
        free = or_(E.c.writer_id.is_(None), E.c.writer_id == writer_id)
        if reopen:
            conn.execute(
                E.update()
                .where(and_(E.c.id == episode_id, E.c.status != "running"))
                .values(writer_id=writer_id, status="running", ended_at=None, exit_code=None)
            )
        conn.execute(E.update().where(and_(E.c.id == episode_id, free)).values(writer_id=writer_id))


def release(store: Store, writer_id: str) -> int:
    """A writer that stops cleanly ends the episodes it still runs (those `serve` records for harnesses)
    as `ok`; returns how many."""
    with store._write() as conn:
        return conn.execute(
            E.update()
            .where(and_(E.c.writer_id == writer_id, E.c.status == "running"))
            .values(status="ok", ended_at=time.time())
        ).rowcount


def writers(store: Store) -> dict[str, dict[str, Any]]:
    """Writers that have running episodes, by ID."""
    running = select(E.c.writer_id).where(E.c.status == "running")
    with store._read() as conn:
        rows = conn.execute(select(W).where(W.c.id.in_(running))).all()
    return {r._mapping["id"]: dict(r._mapping) for r in rows}
