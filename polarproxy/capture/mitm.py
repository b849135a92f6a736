"""mitmproxy inside this process: the one start-up of gateway (reverse mode, capture/proxy.py) and intercept
(regular mode, capture/intercept/proxy.py) proxies.

Only the addons a proxy needs are loaded: mitmproxy's default set (~30: playback, map-local, anticache, cut,
export, ...) would receive every hook of every flow and do nothing here. `start_mitm` returns once
mitmproxy's servers listen (its `running` hook), or raises UsageError when they cannot.

`start_mitm(sock=...)` serves a listening socket bound beforehand (`bind_listener`): `record` binds its
port, starts the harness, and starts mitmproxy beside it (capture/early.py); connections made before
mitmproxy is up wait in the socket's backlog. mitmproxy has no option for a socket of one's own, so its
TCP servers' `listen` is wrapped (`_adopting_listen`) to take a socket handed over for that port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from polarproxy import heap
from polarproxy.errors import UsageError

LISTEN_BACKLOG = 512  # connections the kernel queues while mitmproxy starts (and under load)
_IMPORT_LOCK = threading.Lock()  # held by `_import_lean_addons`
_ADOPTED: dict[int, socket.socket] = {}  # port -> a listening socket for mitmproxy to serve


@dataclass
class RunningMitm:
    port: int
    master: Any  # mitmproxy.master.Master
    task: asyncio.Task[None]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        self.master.shutdown()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


def _import_lean_addons() -> Any:
    """The five addon modules, without `mitmproxy/addons/__init__.py`: it imports all ~30 default addons
    (ldap3 for proxyauth, pyparsing for the filters, ...) for `default_addons()`, which nothing here calls;
    skipping it saves ~0.35 s of `record`'s start (measured: 0.90-1.02 s -> 0.56-0.65 s for mitmproxy's
    master and these five). Where the package is already imported, or the lean import fails on some
    mitmproxy version, the package is imported as usual."""
    import importlib
    import importlib.util
    import sys
    import types

    names = ("core", "dns_resolver", "next_layer", "proxyserver", "tlsconfig")
    with _IMPORT_LOCK:  # it edits sys.modules: one thread at a time (capture/early.py imports in a thread)
        if "mitmproxy.addons" in sys.modules:
            return sys.modules["mitmproxy.addons"]
        spec = importlib.util.find_spec("mitmproxy.addons")
        if spec is not None and spec.submodule_search_locations is not None:
            package = types.ModuleType("mitmproxy.addons")
            package.__path__ = list(spec.submodule_search_locations)
            package.__spec__ = spec
            sys.modules["mitmproxy.addons"] = package
            try:
                for name in names:
                    importlib.import_module(f"mitmproxy.addons.{name}")
                return package
            except Exception:
                for key in [
                    k for k in sys.modules if k == "mitmproxy.addons" or k.startswith("mitmproxy.addons.")
                ]:
                    del sys.modules[key]
        return importlib.import_module("mitmproxy.addons")


def lean_addons() -> list[object]:
    """The mitmproxy addons a proxy needs."""
    addons = _import_lean_addons()
    core, dns_resolver, next_layer = addons.core, addons.dns_resolver, addons.next_layer
    proxyserver, tlsconfig = addons.proxyserver, addons.tlsconfig

    return [
        core.Core(),
        proxyserver.Proxyserver(),
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        dns_resolver.DnsResolver(),
    ]


def import_mitmproxy() -> None:
    """Import what `start_mitm` needs (~0.5 s), e.g. in a thread while the harness starts."""
    import importlib

    _import_lean_addons()
    for name in ("mitmproxy.master", "mitmproxy.options"):
        importlib.import_module(name)


def bind_listener(host: str, port: int, *, what: str = "proxy") -> socket.socket:
    """A listening TCP socket on host:port (0: any free port) for `start_mitm(sock=...)`; connections queue
    in its backlog until mitmproxy serves it. Raises UsageError when it cannot bind."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP, as asyncio's own servers have it: it sets TCP_NODELAY only on sockets that say TCP, and
    # without it every answer waits ~40 ms for the client's delayed ACK (Nagle)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except OSError as e:
        sock.close()
        raise UsageError(
            f"The {what} cannot listen on {host}:{port} ({e.strerror or e}).",
            hint="Pick another --port, or 0 for any free port.",
        ) from e
    return sock


def has_waiting_connection(sock: socket.socket) -> bool:
    """Whether a connection waits in the listening socket's backlog (made, not yet served)."""
    import select

    try:
        return bool(select.select([sock], [], [], 0)[0])
    except (OSError, ValueError):  # closed
        return False


def _adopting_listen() -> bool:
    """Wrap mitmproxy's TCP servers' `listen(host, port)` so that a socket handed over in `_ADOPTED` for
    that port is served instead of a new one bound. False where this mitmproxy has no such method."""
    from mitmproxy.proxy import mode_servers

    cls = getattr(mode_servers, "AsyncioServerInstance", None)
    listen = getattr(cls, "listen", None)
    if cls is None or listen is None:
        return False
    if getattr(listen, "polarproxy_adopts", False):
        return True

    async def adopting(self: Any, host: str, port: int) -> list[Any]:
        sock = _ADOPTED.pop(port, None)
        if sock is None:
            return await listen(self, host, port)
        if getattr(self.mode, "transport_protocol", "tcp") != "tcp":
            sock.close()
            return await listen(self, host, port)
        return [await asyncio.start_server(self.handle_stream, sock=sock, backlog=LISTEN_BACKLOG)]

    adopting.polarproxy_adopts = True  # type: ignore[attr-defined]
    cls.listen = adopting
    return True


class _Ready:
    """Signals when mitmproxy's servers are up (the `running` hook fires after setup)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def running(self) -> None:
        self.event.set()


async def start_mitm(
    addon: object,
    options: Mapping[str, object],
    *,
    host: str,
    port: int,
    what: str = "proxy",
    sock: socket.socket | None = None,
) -> RunningMitm:
    """mitmproxy with `addon` and `options` (mode, confdir, ...), listening on host:port (0: any free port),
    or serving `sock` (`bind_listener`; it is mitmproxy's from then on). `what` names the proxy in the
    errors ("proxy", "intercept proxy")."""
    addons = lean_addons()  # first: mitmproxy.master imports the addons package too
    from mitmproxy.master import Master
    from mitmproxy.options import Options

    if sock is not None:
        host, port = sock.getsockname()[:2]
        if _adopting_listen():
            _ADOPTED[port] = sock
        else:  # a mitmproxy without the hook: it binds the port itself once this socket is closed
            sock.close()

    logging.getLogger("mitmproxy").setLevel(logging.WARNING)
    opts = Options()
    master = Master(opts, with_termlog=False)
    master.addons.add(*addons)
    ready = _Ready()
    master.addons.add(addon, ready)
    opts.update(listen_host=host, listen_port=port, **options)
    task = asyncio.create_task(master.run())
    waiter = asyncio.create_task(ready.event.wait())
    done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if sock is not None and _ADOPTED.get(port) is sock:  # mitmproxy did not take it (it stopped first)
        _ADOPTED.pop(port).close()
    if task in done:
        waiter.cancel()
        task.result()
        raise UsageError(
            f"mitmproxy stopped while starting the {what}.",
            hint="Run again with a free --port; see the log above.",
        )
    addrs = master.addons.get("proxyserver").listen_addrs()
    if not addrs:
        master.shutdown()
        await task
        raise UsageError(
            f"The {what} cannot listen on {host}:{port} (in use, or not an address of this machine).",
            hint="Pick another --port, or 0 for any free port.",
        )
    heap.settle()  # mitmproxy's imports and objects, now built, out of the collector's passes
    return RunningMitm(port=addrs[0][1], master=master, task=task)
