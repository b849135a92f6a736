"""The proxy's one writer thread: store writes run off the event loop, in order, grouped into commits.

Each write is queued with a future; the thread takes everything queued so far and applies it in one
transaction (group commit), so under load one commit covers many calls. Futures resolve only after the
commit, so a call awaited here is on disk (T6). If a grouped transaction fails, its writes are retried one
by one, so one bad write fails alone.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any

from polarproxy.store.records import CallResult, CallStart, EpisodeStart
from polarproxy.store.store import Store

MAX_GROUP = 128

_Op = tuple[Callable[[], Any], asyncio.Future[Any], asyncio.AbstractEventLoop]


class StoreWriter:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._queue: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._known_episodes: set[str] = set()
        self._thread = threading.Thread(target=self._work, name="polarproxy-store", daemon=True)
        self._thread.start()

    def _submit(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._queue.put((fn, fut, loop))
        return fut

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await self._submit(lambda: fn(*args, **kwargs))

    def _work(self) -> None:
        while True:
            first = self._queue.get()
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
            self._apply(ops)
            if stop:
                return

    def _apply(self, ops: list[_Op]) -> None:
        results: list[tuple[bool, Any]] = []
        if len(ops) > 1:
            try:
                with self.store.batch():
                    results = [(True, fn()) for fn, _, _ in ops]
            except Exception:
                results = []  # rolled back: apply one by one so that only the bad write fails
        if not results:
            for fn, _, _ in ops:
                try:
                    results.append((True, fn()))
                except Exception as e:
                    results.append((False, e))
        for (ok, value), (_, fut, loop) in zip(results, ops, strict=True):
            loop.call_soon_threadsafe(_resolve, fut, ok, value)

    async def create_episode(self, start: EpisodeStart) -> str:
        episode_id = await self._run(self.store.create_episode, start)
        self._known_episodes.add(episode_id)
        return episode_id

    async def finish_episode(self, episode_id: str, *, status: str, exit_code: int | None) -> None:
        await self._run(self.store.finish_episode, episode_id, status=status, exit_code=exit_code)

    async def ensure_episode(self, episode_id: str, start: EpisodeStart) -> None:
        if episode_id in self._known_episodes:
            return
        await self._run(self.store.create_episode, start, episode_id=episode_id, exist_ok=True)
        self._known_episodes.add(episode_id)

    async def begin_call(self, start: CallStart) -> tuple[str, int]:
        return await self._run(self.store.begin_call, start)

    async def finish_call(self, call_id: str, result: CallResult) -> None:
        await self._run(self.store.finish_call, call_id, result)

    def close(self) -> None:
        """Apply what is queued, then stop the thread."""
        self._queue.put(None)
        self._thread.join()


def _resolve(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.done():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)
