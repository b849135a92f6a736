"""`record` starts the harness before mitmproxy is up (capture/early.py): a connection made meanwhile waits
in the proxy's socket and is served; a harness that ends first, with nothing waiting, never starts
mitmproxy; a proxy that cannot start kills the harness and fails the episode. The import that makes
mitmproxy's start slow is held by the tests, so each order of events is forced, not hoped for."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import polarproxy.capture.proxy as proxy_module
from polarproxy.backends.stub import StubBackend, StubConfig
from polarproxy.capture import early
from polarproxy.capture.mitm import bind_listener, has_waiting_connection
from polarproxy.capture.stack import ProxyConfig
from polarproxy.errors import UsageError
from polarproxy.harness.record import record
from polarproxy.render.renderer import Renderer
from polarproxy.store import Store

# One chat call through the proxy, its status and text written down; `marker` is written just before.
CALLER = textwrap.dedent(
    """
    import json, os, sys, httpx
    open(sys.argv[1], "w").close()
    r = httpx.post(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=60)
    json.dump([r.status_code, r.json()["choices"][0]["message"]["content"]], open(sys.argv[2], "w"))
    """
)


def _held_import(monkeypatch: pytest.MonkeyPatch, until: Any) -> list[float]:
    """Hold the background import of mitmproxy until `until()` is true (30 s at most); returns when it ran."""
    real = early.import_mitmproxy
    ran: list[float] = []

    def held() -> None:
        deadline = time.monotonic() + 30
        while not until() and time.monotonic() < deadline:
            time.sleep(0.01)
        ran.append(time.monotonic())
        real()

    monkeypatch.setattr(early, "import_mitmproxy", held)
    return ran


def _record(cfg: ProxyConfig, harness: list[str]) -> Any:
    async def go() -> Any:
        renderer = Renderer(cfg.model)
        stub = StubBackend(StubConfig(output_ids=[*renderer.encode("Done."), renderer.stop_token_ids[0]]))
        port = await stub.start()
        cfg.backend = f"http://127.0.0.1:{port}"
        try:
            return await asyncio.wait_for(record(cfg, harness), 90)
        finally:
            await stub.stop()

    return asyncio.run(go())


def _cfg(tiny_model_dir: Path, tmp_path: Path) -> ProxyConfig:
    return ProxyConfig(
        backend="",
        model=tiny_model_dir,
        db=str(tmp_path / "r.db"),
        check_backend=False,
        backend_kind="sglang",
    )


def test_a_call_made_before_mitmproxy_is_up_waits_and_is_served(tiny_model_dir, tmp_path, monkeypatch):
    marker, answer, script = tmp_path / "connecting", tmp_path / "answer.json", tmp_path / "caller.py"
    script.write_text(CALLER)

    def connecting() -> bool:  # the harness is about to connect: give it 0.3 s more to be waiting
        if marker.exists():
            time.sleep(0.3)
            return True
        return False

    _held_import(monkeypatch, connecting)  # mitmproxy is imported only then: the harness's request waits
    cfg = _cfg(tiny_model_dir, tmp_path)
    outcome = _record(cfg, [sys.executable, str(script), str(marker), str(answer)])
    assert outcome.exit_code == 0
    assert json.loads(answer.read_text())[0] == 200
    store = Store.open(cfg.db)
    try:
        calls = store.list_calls(outcome.episode_id)
        episode = store.get_episode(outcome.episode_id)
    finally:
        store.close()
    assert [c.status for c in calls] == ["ok"] and episode.status == "ok"


def test_a_harness_that_ends_before_mitmproxy_is_up_never_starts_it(tiny_model_dir, tmp_path, monkeypatch):
    done = threading.Event()
    ran = _held_import(monkeypatch, done.is_set)
    started: list[int] = []
    real_start = proxy_module.start_proxy

    async def counting_start(*args: Any, **kw: Any) -> Any:
        started.append(1)
        return await real_start(*args, **kw)

    monkeypatch.setattr(proxy_module, "start_proxy", counting_start)
    loads: list[int] = []
    monkeypatch.setattr(Renderer, "load_in_background", lambda self: loads.append(1))
    cfg = _cfg(tiny_model_dir, tmp_path)
    try:
        outcome = _record(cfg, ["true"])
    finally:
        done.set()
    assert outcome.exit_code == 0
    deadline = time.monotonic() + 30
    while not ran and time.monotonic() < deadline:  # the held import lets go once the test says so
        time.sleep(0.01)
    time.sleep(0.2)
    assert started == [] and loads == []  # nor the tokenizer: no call can come
    store = Store.open(cfg.db)
    try:
        episode = store.get_episode(outcome.episode_id)
    finally:
        store.close()
    assert (episode.status, episode.exit_code, episode.calls) == ("ok", 0, 0)


def test_a_proxy_that_cannot_start_kills_the_harness_and_fails_the_episode(
    tiny_model_dir, tmp_path, monkeypatch
):
    async def broken_start(*args: Any, **kw: Any) -> Any:
        raise UsageError("mitmproxy stopped while starting the proxy.", hint="see the log")

    monkeypatch.setattr(proxy_module, "start_proxy", broken_start)
    survived = tmp_path / "survived"
    harness = [sys.executable, "-c", f"import time; time.sleep(20); open({str(survived)!r}, 'w').close()"]
    cfg = _cfg(tiny_model_dir, tmp_path)
    t0 = time.monotonic()
    with pytest.raises(UsageError, match="mitmproxy stopped"):
        _record(cfg, harness)
    assert time.monotonic() - t0 < 15  # the harness was killed, not waited for
    store = Store.open(cfg.db)
    try:
        (episode,) = store.list_episodes()
    finally:
        store.close()
    assert (episode.status, episode.exit_code) == ("failed", None)
    time.sleep(0.5)
    assert not survived.exists()


def test_a_bound_listener_queues_connections_and_refuses_a_taken_port():
    sock = bind_listener("127.0.0.1", 0)
    try:
        assert not has_waiting_connection(sock)
        with socket.create_connection(sock.getsockname()[:2], timeout=5):
            deadline = time.monotonic() + 5
            while not has_waiting_connection(sock) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert has_waiting_connection(sock)
        with pytest.raises(UsageError, match=f"cannot listen on 127.0.0.1:{sock.getsockname()[1]}"):
            bind_listener("127.0.0.1", sock.getsockname()[1])
    finally:
        sock.close()
    assert not has_waiting_connection(sock)  # closed: nothing waits


def test_connections_to_a_bound_listener_get_tcp_nodelay():
    """asyncio turns Nagle off only on sockets that say IPPROTO_TCP; a listener made without it gave every
    answer through `record` a ~40 ms wait for the client's delayed ACK."""

    async def go() -> int:
        sock = bind_listener("127.0.0.1", 0)
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted = writer.get_extra_info("socket")
            seen.set_result(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=sock)
        try:
            _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
            value = await asyncio.wait_for(seen, 10)
            writer.close()
            return value
        finally:
            server.close()

    assert asyncio.run(go()) != 0


def test_a_request_left_waiting_by_a_harness_that_exited_is_still_recorded(
    tiny_model_dir, tmp_path, monkeypatch
):
    """T3: the harness sends a whole request and exits before mitmproxy is up. Its connection waits in the
    socket, so `record` starts the proxy for it, and the call's record says what happened to it."""
    sent = tmp_path / "sent"
    script = tmp_path / "fire.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, os, socket, sys
            from urllib.parse import urlsplit
            url = urlsplit(os.environ["OPENAI_BASE_URL"])
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
            s = socket.create_connection((url.hostname, url.port))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\\r\\nHost: x\\r\\nContent-Type: application/json\\r\\n"
                      + b"Content-Length: %d\\r\\n\\r\\n" % len(body) + body)
            open(sys.argv[1], "w").close()
            """
        )
    )

    def gone() -> bool:  # the request is sent; 0.5 s more and the harness has exited
        if sent.exists():
            time.sleep(0.5)
            return True
        return False

    _held_import(monkeypatch, gone)
    cfg = _cfg(tiny_model_dir, tmp_path)
    outcome = _record(cfg, [sys.executable, str(script), str(sent)])
    assert outcome.exit_code == 0
    store = Store.open(cfg.db)
    try:
        calls = store.list_calls(outcome.episode_id)
    finally:
        store.close()
    # answered to a client that is gone, or aborted while it waited for the tokenizer: either way on record
    assert [c.status for c in calls] in (["ok"], ["aborted"]), [(c.status, c.error) for c in calls]
