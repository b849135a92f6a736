"""The spool: store writes kept on local disk while the database cannot take them, replayed in order later.

When a write fails because the database is unreachable, full or read-only (`is_unavailable`), the proxy's
writer appends it, and every write after it, to its own spool file and fsyncs before answering, so a call
the harness completes is on disk (T6) even with the database down. A replayer applies the file to the
database in order once it answers again, then deletes the file. The happy path never touches a spool file.

Files: `SPOOL_DIR/<hash of the database URL>/<writer id>.spool` (SPOOL_DIR is `$POLARPROXY_SPOOL_DIR`, else
`spool/` in polarproxy's data dir); `db.txt` beside them names the database (password hidden). A live writer
holds an exclusive `flock` on its file; a file nobody holds belongs to a writer that ended (or crashed)
before it could replay, and `polarproxy db repair` (or the next proxy or command to open the database)
replays it.

Records are lines `CRC32 JSON\n`; a torn last line (a crash mid-append, never acknowledged) is skipped.
Every operation is idempotent, with IDs made by the client (`ids.py`), so replaying a file twice, or one
whose first part was already applied, gives the same rows. A call's sequence number is not spooled: it is
handed out by the database when the call is replayed, in the order the writer began its calls.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import zlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from sqlalchemy import exc as sa_exc
from sqlalchemy import select

from polarproxy.store import owners, schema
from polarproxy.store.errors import StoreError
from polarproxy.store.records import CallResult, CallStart, EpisodeStart, RewardOrigin
from polarproxy.store.urls import display_url, is_url, sqlalchemy_url

if TYPE_CHECKING:
    from polarproxy.store.store import Store

log = logging.getLogger("polarproxy.spool")

SPOOL_ENV = "POLARPROXY_SPOOL_DIR"
SUFFIX = ".spool"
REPLAY_CHUNK = 256  # operations per replay transaction
C = schema.calls


class SpoolError(StoreError):
    """Neither the database nor the spool could take a write."""


# ---- what counts as "the database is unavailable" ----------------------------------------------------------

_DATA_ERRORS = (sa_exc.IntegrityError, sa_exc.DataError, sa_exc.ProgrammingError, sa_exc.NotSupportedError)
_UNAVAILABLE = (
    sa_exc.OperationalError,  # connection refused or lost, disk full, read-only file, lock timeout
    sa_exc.InterfaceError,
    sa_exc.InternalError,
    sa_exc.DisconnectionError,
    sa_exc.TimeoutError,  # no pooled connection in time
    OSError,
)


# SQLite reports a missing table and a full disk alike as OperationalError: its error code tells them apart.
_SQLITE_UNAVAILABLE = (
    "SQLITE_FULL",
    "SQLITE_READONLY",
    "SQLITE_CANTOPEN",
    "SQLITE_BUSY",
    "SQLITE_LOCKED",
    "SQLITE_IOERR",
    "SQLITE_PROTOCOL",
    "SQLITE_NOLFS",
    "SQLITE_NOMEM",
)


def is_unavailable(exc: BaseException) -> bool:
    """Whether a failed write failed because of the database (unreachable, full, read-only, locked), so it
    may succeed later, rather than because of its data or a broken schema."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        for e in (getattr(cur, "orig", None), cur):
            name = getattr(e, "sqlite_errorname", None)
            if isinstance(name, str):
                return name.startswith(_SQLITE_UNAVAILABLE)
        if isinstance(cur, _DATA_ERRORS):
            return False
        if isinstance(cur, _UNAVAILABLE):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


# ---- where spools live -------------------------------------------------------------------------------------


def spool_root() -> Path:
    env = os.environ.get(SPOOL_ENV)
    if env:
        return Path(env).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "polarproxy" / "spool"


def spool_dir(url: str) -> Path:
    """The folder of the spools of one database (its URL hashed, password left out). `url` may be any form
    that names it: a path, `postgresql://...`, or the SQLAlchemy URL (`postgresql+psycopg://...`)."""
    if is_url(url):
        shown = display_url(sqlalchemy_url(url))
    else:
        shown = display_url("sqlite:///" + str(Path(url).expanduser().resolve()))
    return spool_root() / hashlib.sha256(shown.encode()).hexdigest()[:16]


# ---- operations (records are kept as objects until spooled: orjson writes dataclasses as JSON) --------------------------------------------------------------------------------------------


def op_create_episode(
    episode_id: str, start: EpisodeStart, writer_id: str, *, reopen: bool
) -> dict[str, Any]:
    return {
        "op": "create_episode",
        "episode_id": episode_id,
        "start": start,
        "writer": writer_id,
        "reopen": reopen,
    }


def op_begin_call(call_id: str, start: CallStart) -> dict[str, Any]:
    return {"op": "begin_call", "call_id": call_id, "start": start}


def op_finish_call(call_id: str, result: CallResult) -> dict[str, Any]:
    return {"op": "finish_call", "call_id": call_id, "result": result}


def op_finish_episode(
    episode_id: str, status: str, exit_code: int | None, stages: dict[str, float] | None = None
) -> dict[str, Any]:
    op = {"op": "finish_episode", "episode_id": episode_id, "status": status, "exit_code": exit_code}
    return {**op, "stages": stages} if stages else op


def op_set_rewards(
    episode_id: str,
    episode: float | None,
    set_episode: bool,
    calls: dict[int, float | None],
    origin: RewardOrigin,
) -> dict[str, Any]:
    return {
        "op": "set_rewards",
        "episode_id": episode_id,
        "episode": episode,
        "set_episode": set_episode,
        "calls": {str(k): v for k, v in calls.items()},
        "origin": origin,
    }


def op_release(writer_id: str) -> dict[str, Any]:
    return {"op": "release", "writer": writer_id}


def _as[T](cls: type[T], value: T | dict[str, Any]) -> T:
    """The record itself (written directly), or rebuilt from its JSON form (read from a spool)."""
    return cls(**value) if isinstance(value, dict) else value


def apply(store: Store, op: dict[str, Any], *, replay: bool = False) -> Any:
    """Apply one operation; with `replay`, a call that is already stored is not begun again."""
    kind = op["op"]
    if kind == "create_episode":
        eid = store.create_episode(_as(EpisodeStart, op["start"]), episode_id=op["episode_id"], exist_ok=True)
        owners.claim(store, eid, op["writer"], reopen=op["reopen"])
        return eid
    if kind == "begin_call":
        if replay:
            with store._write() as conn:
                if conn.execute(select(C.c.id).where(C.c.id == op["call_id"])).first() is not None:
                    return op["call_id"], -1
        return store.begin_call(_as(CallStart, op["start"]), call_id=op["call_id"])
    if kind == "finish_call":
        return store.finish_call(op["call_id"], _as(CallResult, op["result"]))
    if kind == "finish_episode":
        return store.finish_episode(
            op["episode_id"], status=op["status"], exit_code=op["exit_code"], stages=op.get("stages")
        )
    if kind == "release":
        return owners.release(store, op["writer"])
    if kind == "set_rewards":
        from polarproxy.store.rewards import KEEP

        return store.set_rewards(
            op["episode_id"],
            episode=op["episode"] if op["set_episode"] else KEEP,
            calls={int(k): v for k, v in op["calls"].items()},
            origin=_as(RewardOrigin, op["origin"]),
        )
    raise ValueError(f"Unknown spool operation {kind!r}.")


def spooled_result(op: dict[str, Any]) -> Any:
    """What the caller gets for an operation that went to the spool (a call's seq is not known yet: -1)."""
    kind = op["op"]
    if kind == "create_episode":
        return op["episode_id"]
    if kind == "begin_call":
        return op["call_id"], -1
    return None


def _plain(value: Any) -> Any:
    if isinstance(value, (array, tuple, set)):
        return list(value)
    raise TypeError(f"cannot spool a {type(value).__name__}")


def encode(op: dict[str, Any]) -> bytes:
    start = op.get("start")
    if isinstance(start, CallStart) and not isinstance(start.conversation, (dict, type(None))):
        # a parsed Conversation (the gateway's): written as the store keeps it, not as orjson sees a dataclass
        op = {**op, "start": replace(start, conversation=start.conversation_dict())}
    body = orjson.dumps(op, default=_plain)
    return b"%08x %s\n" % (zlib.crc32(body), body)


def decode(line: bytes) -> dict[str, Any] | None:
    """One record, or None for a torn or damaged one."""
    if not line.endswith(b"\n") or len(line) < 10 or line[8:9] != b" ":
        return None
    body = line[9:-1]
    try:
        if int(line[:8], 16) != zlib.crc32(body):
            return None
        return orjson.loads(body)  # type: ignore[no-any-return]
    except ValueError:
        return None


def read_records(
    path: Path, offset: int = 0, limit: int | None = None, end: int | None = None
) -> list[tuple[int, dict[str, Any]]]:
    """Records from byte `offset` up to byte `end` (default: the end of the file): (offset after the record,
    the operation). Damaged lines are skipped."""
    out: list[tuple[int, dict[str, Any]]] = []
    try:
        f = path.open("rb")
    except FileNotFoundError:
        return out
    with f:
        f.seek(offset)
        pos = offset
        for line in f:
            if not line.endswith(b"\n") or (end is not None and pos + len(line) > end):
                break  # being written, or torn by a crash: not acknowledged
            pos += len(line)
            op = decode(line)
            if op is None:
                log.warning("skipping a damaged record at byte %d of %s", pos - len(line), path)
                continue
            if op.get("op") == "header":
                continue
            out.append((pos, op))
            if limit is not None and len(out) >= limit:
                break
    return out


# ---- one writer's spool file -------------------------------------------------------------------------------


class SpoolFile:
    """The append-only spool of one writer. Created on the first append; locked while this object has it."""

    def __init__(self, path: Path, header: dict[str, Any] | None = None) -> None:
        self.path = path
        self.header = header or {}
        self._fd: int | None = None
        self.committed = 0  # the file's size after the last append that reached the disk

    @property
    def size(self) -> int:
        return 0 if self._fd is None else os.fstat(self._fd).st_size

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            note = self.path.parent / "db.txt"
            if not note.exists() and self.header.get("db"):
                with contextlib.suppress(OSError):
                    note.write_text(str(self.header["db"]) + "\n")
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise
            self._fd = fd
            self.committed = os.fstat(fd).st_size
            if self.committed == 0:
                try:
                    self._write([encode({"op": "header", **self.header})])
                except OSError:
                    self.close()
                    with contextlib.suppress(OSError):
                        self.path.unlink()
                    raise
        return self._fd

    def _write(self, records: list[bytes]) -> None:
        assert self._fd is not None
        before = os.fstat(self._fd).st_size
        data = b"".join(records)
        try:
            view = memoryview(data)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            os.fsync(self._fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, before)  # no torn record stays behind an acknowledged one
            raise
        self.committed = before + len(data)

    def append(self, ops: list[dict[str, Any]]) -> None:
        """Append and fsync; on disk when this returns. Raises OSError (disk full, read-only, ...)."""
        self._open()
        self._write([encode(op) for op in ops])

    def discard(self) -> None:
        """Empty and delete the file (everything in it was applied), keeping the lock until it is gone."""
        if self._fd is None:
            return
        self.committed = 0
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        with contextlib.suppress(OSError):
            self.path.unlink()
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the lock
            self._fd = None


# ---- replay ------------------------------------------------------------------------------------------------


@dataclass
class ReplayResult:
    ops: int = 0
    calls: int = 0
    rejected: int = 0
    done: bool = True  # False: the database stopped answering; the rest stays for later
    error: str | None = None


def replay(
    store: Store,
    path: Path,
    *,
    offset: int = 0,
    end: int | None = None,
    before_chunk: Any = None,
    result: ReplayResult | None = None,
) -> tuple[int, ReplayResult]:
    """Apply the records of `path` from `offset` (up to `end`: what its writer has fsynced) in order, in
    chunks; return the offset reached.

    A chunk that fails on the database (`is_unavailable`) stops the replay (`done=False`); one that fails
    on its data is applied one operation at a time, and an operation the database refuses is logged,
    written to `PATH.rejected` and skipped, so one bad record cannot hold the rest back forever."""
    res = result or ReplayResult()
    while True:
        records = read_records(path, offset, REPLAY_CHUNK, end)
        if not records:
            return offset, res
        try:
            with store.batch():
                if before_chunk is not None:
                    before_chunk()
                for _, op in records:
                    apply(store, op, replay=True)
        except Exception as e:
            if is_unavailable(e):
                res.done, res.error = False, str(e)
                return offset, res
            for end, op in records:
                try:
                    with store.batch():
                        apply(store, op, replay=True)
                except Exception as e2:
                    if is_unavailable(e2):
                        res.done, res.error = False, str(e2)
                        return offset, res
                    _reject(path, op, e2)
                    res.rejected += 1
                else:
                    _count(res, op)
                offset = end
            continue
        for _, op in records:
            _count(res, op)
        offset = records[-1][0]


def _count(res: ReplayResult, op: dict[str, Any]) -> None:
    res.ops += 1
    if op["op"] == "begin_call":
        res.calls += 1


def _reject(path: Path, op: dict[str, Any], e: BaseException) -> None:
    log.error("spool %s: the database refused a %s operation, set aside: %s", path, op.get("op"), e)
    with contextlib.suppress(OSError), open(str(path) + ".rejected", "ab") as f:
        f.write(encode({**op, "rejected_because": str(e)}))


@contextlib.contextmanager
def adopt(path: Path) -> Iterator[SpoolFile | None]:
    """Lock a spool file that no live writer holds; None if one does (or it is gone)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
    except FileNotFoundError:
        yield None
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        yield None
        return
    try:
        same = os.fstat(fd).st_ino == os.stat(path).st_ino  # not deleted by its writer meanwhile
    except FileNotFoundError:
        same = False
    if not same or os.fstat(fd).st_size == 0:
        os.close(fd)
        yield None
        return
    spool = SpoolFile(path)
    spool._fd = fd
    try:
        yield spool
    finally:
        spool.close()


def replay_orphans(store: Store) -> ReplayResult:
    """Replay the spool files of this database that no live writer holds; delete each one replayed."""
    total = ReplayResult()
    for path in sorted(spool_dir(store.url).glob("*" + SUFFIX)):
        with adopt(path) as spool:
            if spool is None:
                continue
            _, res = replay(store, path, result=ReplayResult())
            total.ops += res.ops
            total.calls += res.calls
            total.rejected += res.rejected
            if not res.done:
                total.done, total.error = False, res.error
                return total
            spool.discard()
            log.info("replayed %d spooled operations (%d calls) from %s", res.ops, res.calls, path)
    return total


# ---- what is pending ---------------------------------------------------------------------------------------


@dataclass
class Backlog:
    """One spool file waiting to be replayed."""

    path: str
    ops: int
    calls: int  # distinct calls begun or finished in it
    live: bool  # a running writer holds it (it replays it itself)


def pending(url: str) -> list[Backlog]:
    """The spool files of this database and what they hold."""
    out = []
    folder = spool_dir(url)
    for path in sorted(folder.glob("*" + SUFFIX)) if folder.is_dir() else []:
        records = read_records(path)
        if not records:
            continue
        calls = {op["call_id"] for _, op in records if op["op"] in ("begin_call", "finish_call")}
        out.append(Backlog(path=str(path), ops=len(records), calls=len(calls), live=_held(path)))
    return out


def _held(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def describe(backlog: list[Backlog]) -> list[str]:
    """One line per spool file, for `ls` and `db status`."""
    return [
        f"{b.calls} call{'' if b.calls == 1 else 's'} pending in spool {b.path} ({b.ops} writes; "
        + ("its proxy replays it when the database answers)" if b.live else "run `polarproxy db repair`)")
        for b in backlog
    ]
