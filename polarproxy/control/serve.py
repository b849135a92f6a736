"""`polarproxy serve`: the gateway of many episodes, with the control API in front of the recorder.

Calls without an episode go to one new episode (created by the first of them); episodes created through the control API (control/api.py)
are named by their API keys. At the end the running episodes are handed on to any other proxy on the same
database.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from collections.abc import Callable

from polarproxy.capture.proxy import start_episode
from polarproxy.capture.stack import ProxyConfig, close_stack, open_stack
from polarproxy.control.api import Control
from polarproxy.store import keys
from polarproxy.store.errors import StoreError


async def serve(
    cfg: ProxyConfig, *, on_ready: Callable[[str, str], None] | None = None, stop: asyncio.Event | None = None
) -> str:
    """Serve until SIGINT/SIGTERM (or `stop`)."""
    stack = await open_stack(cfg)
    episode_id, proxy = await start_episode(stack, cfg, ["serve"])
    proxy.recorder.control = Control(
        stack.writer,
        token=cfg.control_token,
        default_episode=episode_id,
        url=proxy.url,
        metadata={k: v for k, v in cfg.metadata.items() if k == "model_dir"},
    )
    if on_ready:
        on_ready(proxy.url, episode_id)
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM) if threading.current_thread() is threading.main_thread() else ()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        await proxy.stop()
        try:  # episodes of the control API outlive this proxy: another one on the database serves them on
            await asyncio.to_thread(keys.detach, stack.store, stack.writer.identity.id)
        except StoreError as e:
            print(f"polarproxy: could not hand the running episodes on: {e}", file=sys.stderr)
        if stack.writer.knows_episode(episode_id):  # a call without an episode created it
            await stack.writer.finish_episode(episode_id, status="ok", exit_code=None)
        await close_stack(stack)
    return episode_id
