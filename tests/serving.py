"""`polarproxy serve` (control/serve.py, control API included) in a thread, and a stub backend, for the
tests of the control API, the client and T2 across restarts (import as `from serving import ...`)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from polarproxy.backends.stub import StubBackend, StubConfig
from polarproxy.capture.stack import ProxyConfig
from polarproxy.control.serve import serve
from polarproxy.render.renderer import Renderer


class Stub:
    """The fixed-answer backend double on its own loop: every call answers `reply` and the stop token."""

    def __init__(self, model_dir: Path, reply: str = "Hello there.") -> None:
        renderer = Renderer(model_dir)
        self.output_ids = [*renderer.encode(reply), renderer.stop_token_ids[0]]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.stub = StubBackend(StubConfig(output_ids=self.output_ids))
        port = asyncio.run_coroutine_threadsafe(self.stub.start(), self.loop).result(10)
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.stub.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class ServeThread:
    """`serve` on its own event loop in a thread, until `stop()` (as SIGINT stops the command)."""

    def __init__(self, backend: str, model_dir: Path, db: Path, *, token: str | None = None) -> None:
        self.cfg = ProxyConfig(backend=backend, model=model_dir, db=str(db), control_token=token)
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.url = ""
        self.default_episode = ""
        self.error: BaseException | None = None
        self._stop: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if not self.ready.wait(60):
            raise RuntimeError("serve did not start")
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())
        pending = asyncio.all_tasks(self.loop)  # connections a client kept alive
        for task in pending:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()

        def on_ready(url: str, episode_id: str) -> None:
            self.url, self.default_episode = url, episode_id
            self.ready.set()

        try:
            await serve(self.cfg, on_ready=on_ready, stop=self._stop)
        except BaseException as e:
            self.error = e
            self.ready.set()

    def stop(self) -> None:
        if self._stop is not None and self.thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(30)
