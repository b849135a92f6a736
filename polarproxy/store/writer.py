"""The proxy's one writer thread: store writes run off the event loop, in order, grouped into commits.

Each write is queued with a future; the thread takes everything queued so far and applies it in one
transaction (group commit), so under load one commit covers many calls; a run of call begins and finishes
in a group is a fixed number of statements whatever its length (`Store.write_calls`: the begins' sequence
numbers, their bases, their rows, then the finishes), whose Python work (packing, JSON, body edits) is
done before the transaction opens, so the write lock covers the statements only. Nothing waits for more
writes to arrive: a group is what was already queued when the previous commit ended. Futures resolve only
after the commit (all of a group's at once, one wake-up of each event loop), so a call awaited here is on
disk (T6). If a grouped transaction fails, its writes are retried one by one, so one bad write fails alone.

On a SQLite file a group of call writes alone runs on the thread's own connection
(`Store.held_connection`), and a finish awaited while the writer is idle (nothing queued, nothing being
applied, not spooling) is committed on the event loop's thread, on a second held connection that never
waits: the call's last bytes then wait for one commit instead of two thread hand-offs to a thread on an
idle core (measured: a lone finish took 0.58 ms through the thread, of which 0.35 ms its commit). If the
writers' lock is taken (another writer, another process) or anything fails, the finish goes to the thread
as before, which waits, retries or spools it. That connection leaves WAL checkpoints to the thread's, so no
fsync runs on the loop; and a finish too large to write at once in the loop (`INLINE_MAX_BYTES`) takes
the thread too. PostgreSQL's writes (a network round trip) stay on the thread.

Outages (store/spool.py): when the database cannot take a write (unreachable, full, read-only), that write
and every later one go to this writer's spool file, fsynced before their futures resolve, and a replayer
thread applies the spool to the database in order once it answers, then goes back to writing directly. If
the spool cannot be written either (disk full), the write fails and the gateway answers the harness with a
provider-shaped 503 that names both causes. The happy path never touches the spool.

Crashes (store/owners.py): the writer registers itself in `writers`, names itself as the writer of the
episodes it records, and refreshes a heartbeat, so whoever opens the database after a crash can end this
process's running episodes and mark their in-flight calls `interrupted`. On start it does that for writers
that died before it (store/maintenance.py `recover`).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from polarproxy.store import maintenance, owners, spool
from polarproxy.store.call_writes import PreparedCalls
from polarproxy.store.ids import new_call_id, new_episode_id
from polarproxy.store.records import CallResult, CallStart, EpisodeStart, RewardOrigin, RewardRecord
from polarproxy.store.spool import SpoolError, SpoolFile, is_unavailable
from polarproxy.store.store import Store

log = logging.getLogger("polarproxy.store_writer")

MAX_GROUP = 128
RETRY_FIRST_S = 0.25  # first wait before trying the database again after an outage; doubles up to:
RETRY_MAX_S = 4.0
CLOSE_DRAIN_S = 5.0  # how long `close` waits for a spool to drain before leaving it for `db repair`
INLINE_MAX_BYTES = 256 * 1024  # a finish's output and answer, at most, committed on the event loop's thread


@dataclass(slots=True)
class _Op:
    op: dict[str, Any]  # a spool operation (spool.op_*)
    fut: asyncio.Future[Any] | None
    loop: asyncio.AbstractEventLoop | None


class StoreWriter:
    def __init__(
        self,
        store: Store,
        *,
        heartbeat_s: float = owners.HEARTBEAT_S,
        stale_after: float = owners.STALE_AFTER_S,
        recover: bool = True,
    ) -> None:
        self.store = store
        self.identity = owners.new_identity()
        self.heartbeat_s = heartbeat_s
        self.stale_after = stale_after
        self.spool = SpoolFile(
            spool.spool_dir(store.url) / f"{self.identity.id}{spool.SUFFIX}",
            header={"db": store.url, "writer": self.identity.id, "pid": self.identity.pid},
        )
        self._queue: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._known_episodes: set[str] = set()
        self._mode = threading.Lock()  # guards _spooling and appends to the spool
        self._spooling = False
        self._db_error = ""  # why the database did not take the write that started spooling
        self._replayed = 0  # spool offset applied so far
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._last_heartbeat = 0.0
        self._recover = recover
        self._held = store.held_connection()  # the thread's; None: PostgreSQL or memory, batch() alone
        self._inline = store.held_connection(wait=False)  # the event loop's finishes
        self._inline_lock = threading.Lock()  # one loop at a time uses it
        self._busy = True  # the thread has ops in hand (set by the thread; read by loops)
        self._closing = False
        self.inline_finishes = 0  # finishes committed on an event loop's thread
        self._thread = threading.Thread(target=self._work, name="polarproxy-store", daemon=True)
        self._replayer = threading.Thread(target=self._replay_loop, name="polarproxy-replay", daemon=True)
        self._thread.start()
        self._replayer.start()

    # ---- state -------------------------------------------------------------------------------------------

    @property
    def spooling(self) -> bool:
        """Whether writes are going to the spool (the database stopped answering)."""
        return self._spooling

    # ---- queueing ----------------------------------------------------------------------------------------

    def _submit(self, op: dict[str, Any]) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._queue.put(_Op(op, fut, loop))
        return fut

    async def create_episode(self, start: EpisodeStart) -> str:
        episode_id = await self._submit(
            spool.op_create_episode(new_episode_id(), start, self.identity.id, reopen=False)
        )
        self._known_episodes.add(episode_id)
        return episode_id  # type: ignore[no-any-return]

    async def finish_episode(
        self, episode_id: str, *, status: str, exit_code: int | None, stages: dict[str, float] | None = None
    ) -> None:
        await self._submit(spool.op_finish_episode(episode_id, status, exit_code, stages))

    def knows_episode(self, episode_id: str) -> bool:
        """Whether this writer created or ensured the episode."""
        return episode_id in self._known_episodes

    async def ensure_episode(self, episode_id: str, start: EpisodeStart) -> None:
        """Create the episode a harness named unless this writer knows it; an ended one runs again."""
        if episode_id in self._known_episodes:
            return
        # known from now on: a call that comes meanwhile queues behind this create (one writer thread, in
        # order), and an end (serve's stop) finishes it
        self._known_episodes.add(episode_id)
        try:
            await self._submit(spool.op_create_episode(episode_id, start, self.identity.id, reopen=True))
        except BaseException:
            self._known_episodes.discard(episode_id)
            raise

    async def begin_call(self, start: CallStart) -> tuple[str, int]:
        """(call ID, seq); seq is -1 while the call waits in the spool (the database assigns it on replay)."""
        return await self._submit(spool.op_begin_call(new_call_id(), start))  # type: ignore[no-any-return]

    async def finish_call(self, call_id: str, result: CallResult) -> None:
        if not self._finish_inline(call_id, result):
            await self._submit(spool.op_finish_call(call_id, result))

    def _finish_inline(self, call_id: str, result: CallResult) -> bool:
        """Commit a finish here, on the event loop's thread, if the writer is idle and the write need not
        wait (module docstring); False: nothing was written, the thread must do it."""
        if (
            self._inline is None
            or self._busy
            or self._spooling
            or self._closing
            or not self._queue.empty()
            or 4 * len(result.output_ids) + len(result.response_body or "") > INLINE_MAX_BYTES
            or not self._inline_lock.acquire(blocking=False)
        ):
            return False
        try:
            prepared = self.store.prepare_calls((), [(call_id, result)])
            with self.store.batch(self._inline):
                self.store.write_prepared(prepared)
        except Exception as e:  # busy, unavailable, or a bad write: the thread's way decides (and says)
            log.debug("finish of %s goes to the writer thread: %s", call_id, e)
            return False
        finally:
            self._inline_lock.release()
        self.inline_finishes += 1
        return True

    async def set_rewards(
        self,
        episode_id: str,
        *,
        episode: float | None = None,
        set_episode: bool = True,
        calls: dict[int, float | None] | None = None,
        origin: RewardOrigin,
    ) -> list[RewardRecord] | None:
        """Store.set_rewards through this writer (NotFoundError, ValueError as it raises them); None when the
        rewards went to the spool (the database is down; they are applied, or set aside, on replay)."""
        op = spool.op_set_rewards(episode_id, episode, set_episode, dict(calls or {}), origin)
        return await self._submit(op)  # type: ignore[no-any-return]

    # ---- the writer thread -------------------------------------------------------------------------------

    def _work(self) -> None:
        if self._recover:
            self._recover_dead()
        while True:
            self._busy = False
            try:
                first = self._queue.get(timeout=self.heartbeat_s)
            except queue.Empty:
                first = _Op({"op": "heartbeat"}, None, None)
            self._busy = True
            if first is None:
                return
            ops = [first]
            stop = False
            while len(ops) < MAX_GROUP:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                ops.append(nxt)
            if time.monotonic() - self._last_heartbeat >= self.heartbeat_s and ops[0].op["op"] != "heartbeat":
                ops.insert(0, _Op({"op": "heartbeat"}, None, None))
            try:
                self._apply(ops)
            except Exception as e:  # a bug here must not stop the thread that every call waits on
                log.exception("store writer failed")
                for o in ops:
                    _settle(o, False, e)
            if stop:
                return

    def _apply(self, ops: list[_Op]) -> None:
        with self._mode:
            if self._spooling:
                self._to_spool(ops)
                return
        try:
            segments = self._plan(ops)  # its call writes' Python work, before the write lock is taken
            calls_only = all(prepared is not None for _, prepared in segments)
            with self.store.batch(self._held if calls_only else None):
                results = self._direct_group(segments)
        except Exception as e:
            if is_unavailable(e):
                self._start_spooling(e, ops)
                return
        else:
            _settle_all([(o, True, value) for o, value in zip(ops, results, strict=True)])
            return
        for i, o in enumerate(ops):  # rolled back on a bad write: one by one, so that it fails alone
            try:
                with self.store.batch():
                    value = self._direct(o.op)
            except Exception as e:
                if is_unavailable(e):
                    self._start_spooling(e, ops[i:])
                    return
                _settle(o, False, e)
            else:
                _settle(o, True, value)

    def _plan(self, ops: list[_Op]) -> list[tuple[list[_Op], PreparedCalls | None]]:
        """A group cut into its segments, in order: each run of call begins and finishes with the run
        prepared as one `write_calls` (its begins, then its finishes; no finish in a run can be of a call
        begun in it, since the call's ID comes from its begin's future), and every other op alone."""
        segments: list[list[_Op]] = []
        for o in ops:
            if segments and _call_write(o.op) and _call_write(segments[-1][0].op):
                segments[-1].append(o)
            else:
                segments.append([o])
        return [(seg, self._prepare_run(seg) if _call_write(seg[0].op) else None) for seg in segments]

    def _prepare_run(self, run: list[_Op]) -> PreparedCalls:
        begins = [(o.op["call_id"], o.op["start"]) for o in run if o.op["op"] == "begin_call"]
        finishes = [(o.op["call_id"], o.op["result"]) for o in run if o.op["op"] == "finish_call"]
        return self.store.prepare_calls(begins, finishes)

    def _direct_group(self, segments: list[tuple[list[_Op], PreparedCalls | None]]) -> list[Any]:
        """Apply a planned group in order inside the open batch: each run as one write, other ops alone."""
        results: list[Any] = []
        for run, prepared in segments:
            if prepared is None:
                results.append(self._direct(run[0].op))
                continue
            began = iter(self.store.write_prepared(prepared))
            results += [next(began) if o.op["op"] == "begin_call" else None for o in run]
        return results

    def _direct(self, op: dict[str, Any]) -> Any:
        if op["op"] == "heartbeat":
            owners.heartbeat(self.store, self.identity)
            self._last_heartbeat = time.monotonic()
            return None
        return spool.apply(self.store, op)

    def _start_spooling(self, e: BaseException, ops: list[_Op]) -> None:
        with self._mode:
            if not self._spooling:
                self._db_error = str(e)
                self._spooling = True
                log.warning("the database does not take writes (%s); spooling to %s", e, self.spool.path)
            self._to_spool(ops)
        self._wake.set()

    def _to_spool(self, ops: list[_Op]) -> None:
        """Append to the spool and fsync (the caller holds `_mode`); heartbeats are not spooled."""
        ops = [o for o in ops if o.op["op"] != "heartbeat"]
        if not ops:
            return
        try:
            self.spool.append([o.op for o in ops])
        except (OSError, TypeError, ValueError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            err = SpoolError(
                f"{self._db_error}; and the spool {self.spool.path} cannot be written either: "
                f"{why}. Free disk space (or make the database writable) and try again."
            )
            for o in ops:
                _settle(o, False, err)
            return
        _settle_all([(o, True, spool.spooled_result(o.op)) for o in ops])

    # ---- the replayer thread -----------------------------------------------------------------------------

    def _recover_dead(self) -> None:
        """Before this writer's first write: replay spools of dead writers, end their running episodes."""
        try:
            report = maintenance.recover(self.store, stale_after=self.stale_after)
        except Exception as e:  # best effort: whoever opens the database next tries again
            log.warning("could not recover the episodes of dead proxies: %s", e)
            return
        if report.episodes or report.replayed_ops:
            log.warning(
                "recovered: %d spooled writes replayed, %d episodes of dead proxies ended as interrupted",
                report.replayed_ops,
                len(report.episodes),
            )

    def _replay_loop(self) -> None:
        wait = RETRY_FIRST_S
        while not self._stopping.is_set():
            if not self._spooling:
                self._wake.wait(1.0)
                self._wake.clear()
                wait = RETRY_FIRST_S
                continue
            if self._drain():
                wait = RETRY_FIRST_S
                continue
            self._wake.wait(wait)
            self._wake.clear()
            wait = min(wait * 2, RETRY_MAX_S)

    def _drain(self) -> bool:
        """Replay the spool into the database; back to direct writes when it is empty. False: not yet."""
        try:
            with self.store.batch():
                owners.heartbeat(self.store, self.identity)  # the database answers again
        except Exception as e:
            if not is_unavailable(e):
                log.error("heartbeat failed: %s", e)
            return False
        while True:
            # only what was fsynced: a failed append is cut off again, so its torn part is never applied
            offset, res = spool.replay(
                self.store, self.spool.path, offset=self._replayed, end=self.spool.committed
            )
            self._replayed = offset
            if not res.done:
                return False
            with self._mode:
                if self.spool.committed > offset:
                    continue  # more was appended meanwhile
                self.spool.discard()
                self._replayed = 0
                self._spooling = False
                log.warning("the database answers again: the spool is replayed, writing directly")
                return True

    # ---- closing -----------------------------------------------------------------------------------------

    def close(self, drain_s: float = CLOSE_DRAIN_S) -> None:
        """Apply what is queued, end the episodes this writer still runs, let a spool drain (up to `drain_s`),
        then stop. A spool that cannot drain stays on disk for `polarproxy db repair`."""
        self._closing = True
        self._queue.put(_Op(spool.op_release(self.identity.id), None, None))
        self._queue.put(None)
        self._thread.join()
        deadline = time.monotonic() + drain_s
        while self._spooling and time.monotonic() < deadline:
            self._wake.set()
            time.sleep(0.05)
        self._stopping.set()
        self._wake.set()
        self._replayer.join()
        with self._inline_lock:
            for held in (self._held, self._inline):
                if held is not None:
                    held.close()
        if self._spooling:
            log.error(
                "the database did not come back: %s keeps the writes not yet stored; run `polarproxy db repair` "
                "when it answers",
                self.spool.path,
            )
        self.spool.close()


def _call_write(op: dict[str, Any]) -> bool:
    """A begin or finish given as records (a spooled one read back is a dict, applied by spool.apply)."""
    if op["op"] == "begin_call":
        return isinstance(op["start"], CallStart)
    return op["op"] == "finish_call" and isinstance(op["result"], CallResult)


def _settle_all(settled: list[tuple[_Op, bool, Any]]) -> None:
    """Resolve a group's futures with one wake-up per event loop (not one per future)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], bool, Any]]] = {}
    for o, ok, value in settled:
        if o.fut is None or o.loop is None:
            _settle(o, ok, value)
        else:
            by_loop.setdefault(o.loop, []).append((o.fut, ok, value))
    for loop, items in by_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve_many, items)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass


def _resolve_many(items: list[tuple[asyncio.Future[Any], bool, Any]]) -> None:
    for fut, ok, value in items:
        _resolve(fut, ok, value)


def _settle(o: _Op, ok: bool, value: Any) -> None:
    if o.fut is None or o.loop is None:
        if not ok:
            log.error("store write %s failed: %s", o.op["op"], value)
        return
    try:
        o.loop.call_soon_threadsafe(_resolve, o.fut, ok, value)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass


def _resolve(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.done():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)
