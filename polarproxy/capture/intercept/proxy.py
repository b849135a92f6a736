"""Start mitmproxy as a forward proxy (regular mode) with the intercept addon, inside this process
(the start-up itself is capture/mitm.py, shared with the gateway)."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from polarproxy.capture.intercept.addon import Interceptor
from polarproxy.capture.intercept.ca import CA
from polarproxy.capture.intercept.providers import Providers
from polarproxy.capture.mitm import RunningMitm, start_mitm
from polarproxy.store.writer import StoreWriter


@dataclass
class InterceptProxy(RunningMitm):
    addon: Interceptor


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
    sock: socket.socket
    | None = None,  # a listening socket to serve (mitm.bind_listener) instead of host:port
) -> InterceptProxy:
    addon = Interceptor(writer=writer, episode_id=episode_id, providers=providers, resolve=resolve)
    options: dict[str, object] = {
        "mode": ["regular"],
        "confdir": str(ca.dir),
        "allow_hosts": providers.allow_hosts(),
    }
    if upstream_ca is not None:
        options["ssl_verify_upstream_trusted_ca"] = str(upstream_ca)
    mitm = await start_mitm(addon, options, host=host, port=port, what="intercept proxy", sock=sock)
    return InterceptProxy(port=mitm.port, master=mitm.master, task=mitm.task, addon=addon)
