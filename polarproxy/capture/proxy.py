"""Run mitmproxy with the recorder addon inside this process, in front of a stack (capture/stack.py), for
`record`, `serve`, `rollout` and Ray nodes; the start-up itself is capture/mitm.py, shared with intercept
mode. Importing this module imports mitmproxy: `record` loads it beside the harness (capture/early.py)."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from polarproxy.capture.addon import Recorder
from polarproxy.capture.gateway import Gateway
from polarproxy.capture.mitm import RunningMitm, start_mitm
from polarproxy.capture.stack import ProxyConfig, Stack, close_stack, episode_start
from polarproxy.store.ids import new_episode_id
from polarproxy.store.records import EpisodeStart


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
    default_start: EpisodeStart
    | None = None,  # what the default episode starts with (made by its first call)
) -> RunningProxy:
    recorder = Recorder(
        gateway=gateway,
        writer=writer,
        default_episode=default_episode,
        model_name=model_name,
    )
    recorder.default_start = default_start  # set before it serves: the first call may come at once
    options: dict[str, object] = {
        "mode": [f"reverse:{gateway.backend.url}"],
        "connection_strategy": "lazy",
        "keep_host_header": True,  # the harness's Host, as sent (serve checks it: DNS rebinding)
    }
    if confdir is not None:
        options["confdir"] = str(confdir)
    mitm = await start_mitm(recorder, options, host=host, port=port, what="proxy", sock=sock)
    return RunningProxy(port=mitm.port, master=mitm.master, task=mitm.task, recorder=recorder)


async def serve_recorder(
    stack: Stack,
    episode_id: str | None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    sock: socket.socket | None = None,
    default_start: EpisodeStart | None = None,
) -> RunningProxy:
    """mitmproxy with the recorder (on host:port, or serving `sock`), calls that name no episode going to
    `episode_id` (None: none; with a control token every call needs an episode's key); once it serves, the
    tokenizer starts loading in the background (the first call waits for it)."""
    proxy = await start_proxy(
        stack.gateway,
        writer=stack.writer,
        default_episode=episode_id,
        model_name=stack.renderer.model_dir.name,
        host=host,
        port=port,
        sock=sock,
        default_start=default_start,
    )
    stack.renderer.load_in_background()
    return proxy


async def start_episode(stack: Stack, cfg: ProxyConfig, command: list[str]) -> tuple[str, RunningProxy]:
    """Name the episode that calls without one go to, and start mitmproxy with the recorder (`serve`). The
    episode is created by its first call (`Recorder.default_start`): a serve nobody calls that way leaves no
    empty episode behind."""
    episode_id = new_episode_id()
    try:
        proxy = await serve_recorder(
            stack, episode_id, host=cfg.host, port=cfg.port, default_start=episode_start(cfg, command)
        )
    except BaseException:
        await close_stack(stack)
        raise
    return episode_id, proxy
