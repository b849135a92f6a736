"""Run mitmproxy with the recorder addon inside this process (for `record` and `serve`; the start-up itself
is capture/mitm.py, shared with intercept mode)."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from polarproxy.capture.addon import Recorder
from polarproxy.capture.gateway import Gateway
from polarproxy.capture.mitm import RunningMitm, start_mitm


@dataclass
class RunningProxy(RunningMitm):
    recorder: Recorder


async def start_proxy(
    gateway: Gateway,
    *,
    writer: object,
    default_episode: str | None,  # None: every call names its episode (a control token guards the proxy)
    model_name: str,
    host: str = "127.0.0.1",
    port: int = 0,
    confdir: Path | None = None,
    sock: socket.socket
    | None = None,  # a listening socket to serve (mitm.bind_listener) instead of host:port
) -> RunningProxy:
    recorder = Recorder(
        gateway=gateway,
        writer=writer,
        default_episode=default_episode,
        model_name=model_name,
    )
    options: dict[str, object] = {
        "mode": [f"reverse:{gateway.backend.url}"],
        "connection_strategy": "lazy",
        "keep_host_header": False,
    }
    if confdir is not None:
        options["confdir"] = str(confdir)
    mitm = await start_mitm(recorder, options, host=host, port=port, what="proxy", sock=sock)
    return RunningProxy(port=mitm.port, master=mitm.master, task=mitm.task, recorder=recorder)
