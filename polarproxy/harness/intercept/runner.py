"""`polarproxy record --intercept -- CMD`: one episode of a harness talking to its real provider.

The child keeps its own keys and base URLs; it gets the proxy variables and a trust bundle with the
polarproxy CA (`env.py`). It runs with the terminal's stdin/stdout/stderr, through the same child runner as
gateway `record` (harness/child.py: signals, process group, exit code).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from polarproxy.capture.early import EarlyProxy
from polarproxy.capture.intercept.ca import ensure_ca
from polarproxy.capture.intercept.providers import Providers
from polarproxy.capture.recording import create_recorded_episode, open_recording_store
from polarproxy.errors import UsageError
from polarproxy.harness.child import ChildExit, run_child, stop_harness
from polarproxy.harness.intercept.env import intercept_env, write_bundles
from polarproxy.harness.record import RecordOutcome
from polarproxy.store.writer import StoreWriter

if TYPE_CHECKING:  # mitmproxy is imported only when the proxy starts (capture/early.py)
    from polarproxy.capture.intercept.proxy import InterceptProxy


@dataclass
class InterceptConfig:
    db: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    hosts: list[str] = field(default_factory=list)  # --host patterns recorded besides the known providers
    resolve: dict[str, tuple[str, int]] = field(default_factory=dict)  # --resolve HOST=IP:PORT
    upstream_ca: Path | None = None  # --upstream-ca: trust this CA for upstream servers (tests, proxies)
    ca_dir: Path | None = None
    harness: str | None = None
    task: str | None = None
    group_id: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)


def parse_resolve(items: list[str]) -> dict[str, tuple[str, int]]:
    """`HOST=ADDR:PORT` (or curl's `HOST:PORT:ADDR`) items into {host: (addr, port)}."""
    out: dict[str, tuple[str, int]] = {}
    for item in items:
        host, eq, target = item.partition("=")
        if eq:
            addr, _, port = target.rpartition(":")
        else:
            host, _, rest = item.partition(":")
            port, _, addr = rest.partition(":")
        addr = addr.strip("[]")
        if not host or not addr or not port.isdigit() or not 0 < int(port) < 65536:
            raise UsageError(
                f"Bad --resolve {item!r}.",
                hint="Write HOST=ADDRESS:PORT, e.g. --resolve api.openai.com=127.0.0.1:8443.",
            )
        out[host.lower()] = (addr, int(port))
    return out


async def record_intercept(
    cfg: InterceptConfig, command: list[str], *, on_ready: Callable[[str, str], None] | None = None
) -> RecordOutcome:
    """Run `command` with its HTTPS going through the intercept proxy; one episode; the child's exit code."""
    try:
        providers = Providers.of(cfg.hosts)
    except ValueError as e:
        raise UsageError(str(e)) from e
    if cfg.upstream_ca is not None and not cfg.upstream_ca.is_file():
        raise UsageError(
            f"--upstream-ca {cfg.upstream_ca} is not a file.", hint="Pass a PEM file with the CA certificate."
        )
    ca = ensure_ca(cfg.ca_dir)
    store = open_recording_store(cfg.db)  # refused before the harness runs when it takes no writes
    writer = StoreWriter(store)
    episode_id = await create_recorded_episode(
        writer,
        command,
        harness=cfg.harness,
        task=cfg.task,
        group_id=cfg.group_id,
        metadata={"mode": "intercept", **cfg.metadata},
    )

    async def start(sock: socket.socket) -> InterceptProxy:
        from polarproxy.capture.intercept.proxy import start_intercept_proxy

        return await start_intercept_proxy(
            writer=writer,
            episode_id=episode_id,
            ca=ca,
            providers=providers,
            resolve=cfg.resolve,
            upstream_ca=cfg.upstream_ca,
            sock=sock,
        )

    try:  # mitmproxy starts beside the harness (capture/early.py)
        proxy = EarlyProxy(
            start,
            module="polarproxy.capture.intercept.proxy",
            host=cfg.host,
            port=cfg.port,
            what="intercept proxy",
        )
    except BaseException:
        await writer.finish_episode(episode_id, status="failed", exit_code=None)
        writer.close()
        raise
    if on_ready:
        on_ready(proxy.url, episode_id)
    rc: int | None = None  # None: the harness did not run to its end (the proxy could not start)
    harness: asyncio.Task[ChildExit] | None = None
    tmp = Path(tempfile.mkdtemp(prefix="polarproxy-intercept-"))
    try:
        bundle, node_extra = write_bundles(os.environ, ca, tmp)
        env = intercept_env(os.environ, proxy.url, bundle, node_extra)
        env["POLARPROXY_EPISODE"] = episode_id
        # signals, process group, exit code: harness/child.py; the proxy starts meanwhile
        harness = asyncio.create_task(run_child(command, env))
        await proxy.until_needed(harness)
        child = await harness
        if child.error:
            print(f"Error: {child.error}", file=sys.stderr)
        rc = child.code
    finally:
        await stop_harness(harness)
        shutil.rmtree(tmp, ignore_errors=True)
        await proxy.close()
        await writer.finish_episode(episode_id, status="ok" if rc == 0 else "failed", exit_code=rc)
        writer.close()
    assert rc is not None  # set once the harness ended; anything else raised above
    return RecordOutcome(exit_code=rc, episode_id=episode_id, db=str(store.url))
