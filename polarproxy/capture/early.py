"""mitmproxy started beside the harness, for `record` (gateway and intercept mode).

`record` binds the proxy's socket first and starts the harness at once with its URL; mitmproxy is imported
in a thread (~0.5 s) and started on the event loop meanwhile, serving that socket (capture/mitm.py). The
harness's first connections wait in the socket's backlog until mitmproxy serves them, so its own start-up
and mitmproxy's overlap. A harness that ends before mitmproxy is up, with no connection waiting, never
needed the proxy: mitmproxy is then not started at all (`record -- true`). One that ends leaving a
connection waiting gets the proxy started for it, and the call is recorded (T3).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from polarproxy import heap
from polarproxy.capture.mitm import RunningMitm, bind_listener, has_waiting_connection, import_mitmproxy


class EarlyProxy[P: RunningMitm]:
    """One `record`'s proxy: its socket bound and its URL known at once (UsageError when the port cannot be
    bound), mitmproxy imported in the background (`module`: the one that starts it, imported first) and then
    started by `start(sock)` on the loop; `until_needed` waits for it or gives it up. `what` names the proxy
    in errors, as in `start_mitm`."""

    def __init__(
        self,
        start: Callable[[socket.socket], Awaitable[P]],
        *,
        module: str,
        host: str,
        port: int,
        what: str = "proxy",
    ) -> None:
        self.sock = bind_listener(host, port, what=what)
        bound = self.sock.getsockname()[1]
        self.url = f"http://[{host}]:{bound}" if ":" in host else f"http://{host}:{bound}"
        self.proxy: P | None = None
        self._given_up = threading.Event()
        loop = asyncio.get_running_loop()
        self._imported: asyncio.Future[None] = loop.create_future()
        self.task = asyncio.create_task(self._start(start))
        threading.Thread(
            target=self._import, args=(loop, module), name="polarproxy-mitmproxy", daemon=True
        ).start()

    def _import(self, loop: asyncio.AbstractEventLoop, module: str) -> None:
        error: BaseException | None = None
        try:
            for step in (lambda: importlib.import_module(module), import_mitmproxy):
                if self._given_up.is_set():  # the harness has ended: the rest is not needed
                    return
                step()
        except BaseException as e:  # handed to the loop, raised where the proxy is waited for
            error = e
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(self._imported_done, error)

    def _imported_done(self, error: BaseException | None) -> None:
        if self._imported.done():
            return
        if error is None:
            self._imported.set_result(None)
        else:
            self._imported.set_exception(error)

    async def _start(self, start: Callable[[socket.socket], Awaitable[P]]) -> P:
        await self._imported
        self.proxy = await start(self.sock)
        return self.proxy

    async def until_needed(self, harness: asyncio.Task[Any], *, always: bool = False) -> P | None:
        """The proxy once it serves (raising why it could not start); None when the harness ended before,
        with no connection waiting and mitmproxy still importing, and `always` (a verifier may call the
        proxy after the harness) is False: then the proxy is given up. Either way the start-up is over: the
        cyclic garbage collector, which `polarproxy record` pauses for it (cli.py), runs again."""
        try:
            await asyncio.wait({self.task, harness}, return_when=asyncio.FIRST_COMPLETED)
            idle = (
                not self.task.done() and not self._imported.done() and not has_waiting_connection(self.sock)
            )
            if idle and not always:
                self._give_up()
                return None
            return await self.task
        finally:
            heap.settle()  # what the paused start-up built is young: frozen, not walked at the next pass
            gc.enable()

    def _give_up(self) -> None:
        self._given_up.set()
        self.task.cancel()
        self.sock.close()

    async def close(self) -> None:
        """Stop the proxy if it serves; give it up if it is still importing (a start under way is waited for)."""
        if not self.task.done() and not self._imported.done():
            self._give_up()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await self.task
        if self.proxy is not None:
            await self.proxy.stop()
            self.proxy = None
        self.sock.close()
