"""Run mitmproxy with the recorder addon inside this process (for `record` and `serve`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

from polarproxy.capture.addon import Recorder
from polarproxy.capture.gateway import Gateway
from polarproxy.errors import UsageError


@dataclass
class RunningProxy:
    port: int
    master: object
    task: asyncio.Task[None]
    recorder: Recorder

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        self.master.shutdown()  # type: ignore[attr-defined]
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


def _gateway_addons() -> list[object]:
    """The mitmproxy addons a reverse-mode gateway needs. mitmproxy's default set (~30) receives every hook
    of every flow; most of it (playback, map-local, anticache, cut, export, ...) does nothing here."""
    from mitmproxy.addons import core, dns_resolver, next_layer, proxyserver, tlsconfig

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


async def start_proxy(
    gateway: Gateway,
    *,
    writer: object,
    default_episode: str,
    model_name: str,
    host: str = "127.0.0.1",
    port: int = 0,
    confdir: Path | None = None,
) -> RunningProxy:
    from mitmproxy.master import Master
    from mitmproxy.options import Options

    logging.getLogger("mitmproxy").setLevel(logging.WARNING)
    opts = Options()
    master = Master(opts, with_termlog=False)
    master.addons.add(*_gateway_addons())
    recorder = Recorder(
        gateway=gateway,
        writer=writer,
        default_episode=default_episode,  # type: ignore[arg-type]
        model_name=model_name,
    )
    ready = _Ready()
    master.addons.add(recorder, ready)
    update: dict[str, object] = {
        "mode": [f"reverse:{gateway.backend.url}"],
        "listen_host": host,
        "listen_port": port,
        "connection_strategy": "lazy",
        "keep_host_header": False,
    }
    if confdir is not None:
        update["confdir"] = str(confdir)
    opts.update(**update)
    task = asyncio.create_task(master.run())
    waiter = asyncio.create_task(ready.event.wait())
    done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        task.result()
        raise UsageError(
            "mitmproxy stopped while starting.", hint="Run again with a free --port; see the log above."
        )
    ps = master.addons.get("proxyserver")
    addrs = ps.listen_addrs()
    if not addrs:
        master.shutdown()
        await task
        raise UsageError(
            f"The proxy cannot listen on {host}:{port} (in use, or not an address of this machine).",
            hint="Pick another --port, or 0 for any free port.",
        )
    return RunningProxy(port=addrs[0][1], master=master, task=task, recorder=recorder)
