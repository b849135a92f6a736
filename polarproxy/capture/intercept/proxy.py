"""Start mitmproxy as a forward proxy (regular mode) with the intercept addon, inside this process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from polarproxy.capture.intercept.addon import Interceptor
from polarproxy.capture.intercept.ca import CA
from polarproxy.capture.intercept.providers import Providers
from polarproxy.capture.store_writer import StoreWriter
from polarproxy.errors import UsageError


@dataclass
class InterceptProxy:
    port: int
    master: object
    task: asyncio.Task[None]
    addon: Interceptor

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        self.master.shutdown()  # type: ignore[attr-defined]
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


class _Ready:
    def __init__(self) -> None:
        self.event = asyncio.Event()

    def running(self) -> None:
        self.event.set()


def _addons() -> list[object]:
    """What a forward proxy needs; mitmproxy's default set adds ~25 addons that would see every flow."""
    from mitmproxy.addons import core, dns_resolver, next_layer, proxyserver, tlsconfig

    return [
        core.Core(),
        proxyserver.Proxyserver(),
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        dns_resolver.DnsResolver(),
    ]


async def start_intercept_proxy(
    *,
    writer: StoreWriter,
    episode_id: str,
    ca: CA,
    providers: Providers,
    resolve: Mapping[str, tuple[str, int]] | None = None,
    upstream_ca: Path | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
) -> InterceptProxy:
    from mitmproxy.master import Master
    from mitmproxy.options import Options

    logging.getLogger("mitmproxy").setLevel(logging.WARNING)
    opts = Options()
    master = Master(opts, with_termlog=False)
    master.addons.add(*_addons())
    addon = Interceptor(writer=writer, episode_id=episode_id, providers=providers, resolve=resolve)
    ready = _Ready()
    master.addons.add(addon, ready)
    update: dict[str, object] = {
        "mode": ["regular"],
        "listen_host": host,
        "listen_port": port,
        "confdir": str(ca.dir),
        "allow_hosts": providers.allow_hosts(),
    }
    if upstream_ca is not None:
        update["ssl_verify_upstream_trusted_ca"] = str(upstream_ca)
    opts.update(**update)
    task = asyncio.create_task(master.run())
    waiter = asyncio.create_task(ready.event.wait())
    done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        task.result()
        raise UsageError("mitmproxy stopped while starting.", hint="Run again with a free --port.")
    addrs = master.addons.get("proxyserver").listen_addrs()
    if not addrs:
        master.shutdown()
        await task
        raise UsageError(
            f"The intercept proxy cannot listen on {host}:{port} (in use, or not an address of this machine).",
            hint="Pick another --port, or 0 for any free port.",
        )
    return InterceptProxy(port=addrs[0][1], master=master, task=task, addon=addon)
