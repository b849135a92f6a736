"""mitmproxy inside this process: the one start-up of gateway (reverse mode, capture/proxy.py) and intercept
(regular mode, capture/intercept/proxy.py) proxies.

Only the addons a proxy needs are loaded: mitmproxy's default set (~30: playback, map-local, anticache, cut,
export, ...) would receive every hook of every flow and do nothing here. `start_mitm` returns once
mitmproxy's servers listen (its `running` hook), or raises UsageError when they cannot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from polarproxy.errors import UsageError


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
    if "mitmproxy.addons" not in sys.modules:
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


class _Ready:
    """Signals when mitmproxy's servers are up (the `running` hook fires after setup)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def running(self) -> None:
        self.event.set()


async def start_mitm(
    addon: object, options: Mapping[str, object], *, host: str, port: int, what: str = "proxy"
) -> RunningMitm:
    """mitmproxy with `addon` and `options` (mode, confdir, ...), listening on host:port (0: any free port).
    `what` names the proxy in the errors ("proxy", "intercept proxy")."""
    addons = lean_addons()  # first: mitmproxy.master imports the addons package too
    from mitmproxy.master import Master
    from mitmproxy.options import Options

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
    return RunningMitm(port=addrs[0][1], master=master, task=task)
