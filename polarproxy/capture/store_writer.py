"""The proxy's one writer thread: store calls run off the event loop, in order, one at a time.

A single thread keeps SQLite writes from contending inside one process; every method returns only once
the row is committed, which is what T6 needs before the final byte goes to the harness.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from polarproxy.store.records import CallResult, CallStart, EpisodeStart
from polarproxy.store.store import Store


class StoreWriter:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="polarproxy-store")
        self._known_episodes: set[str] = set()

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

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
        self._pool.shutdown(wait=True)
