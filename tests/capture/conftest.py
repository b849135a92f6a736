"""Real processes on loopback: a local backend subprocess and the recording proxy in a thread."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from polarproxy.capture.proxy import start_proxy
from polarproxy.capture.stack import ProxyConfig, close_stack, open_stack
from polarproxy.store.records import EpisodeStart


class ProxyThread:
    """The proxy (mitmproxy + recorder addon + gateway) on its own event loop in a thread."""

    def __init__(self, cfg: ProxyConfig) -> None:
        self.cfg = cfg
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.url = ""
        self.episode_id = ""
        self._stop: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if not self.ready.wait(60):
            raise RuntimeError("proxy did not start")
        if self.error:
            raise self.error

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    async def _main(self) -> None:
        try:
            self.stack = await open_stack(self.cfg)
            self.episode_id = await self.stack.writer.create_episode(EpisodeStart(command=["test"]))
            self.proxy = await start_proxy(
                self.stack.gateway,
                writer=self.stack.writer,
                default_episode=self.episode_id,
                model_name="tiny",
            )
            self.url = self.proxy.url
            self._stop = asyncio.Event()
        except BaseException as e:
            self.error = e
            self.ready.set()
            return
        self.ready.set()
        await self._stop.wait()
        await self.proxy.stop()
        await close_stack(self.stack)

    def stop(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(30)

    @property
    def store(self):  # the proxy's own Store (thread-safe for reads)
        return self.stack.store


@pytest.fixture
def make_proxy(tmp_path: Path, tiny_model_dir: Path):
    proxies: list[ProxyThread] = []

    def make(backend_url: str, **kw) -> ProxyThread:
        fields = {
            "backend": backend_url,
            "model": tiny_model_dir,
            "db": str(tmp_path / f"p{len(proxies)}.db"),
        }
        cfg = ProxyConfig(**{**fields, **kw})
        p = ProxyThread(cfg)
        proxies.append(p)
        return p

    yield make
    for p in proxies:
        p.stop()
