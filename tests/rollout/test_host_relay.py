"""The host end of an episode's bridge in front of a real `serve` (control token, two episodes): only
requests that carry the episode's own key reach the gateway; another episode's key, no key, a second
request pipelined or smuggled behind a chunked body, ambiguous framing and upgrades are refused at the
socket, in the dialect's error shape, and nothing of them is stored."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest
from serving import ServeThread, Stub

from polarproxy.client import Client
from polarproxy.rollout.host_relay import HostRelay
from polarproxy.store import Store

TOKEN = "relay-test-token"


@pytest.fixture
def gateway(tiny_model_dir, tmp_path):
    stub = Stub(tiny_model_dir)
    served = ServeThread(stub.url, tiny_model_dir, tmp_path / "relay.db", token=TOKEN)
    with Client(served.url, TOKEN) as control:
        mine, other = control.create_episode(task="mine"), control.create_episode(task="other")
    port = int(served.url.rsplit(":", 1)[1])
    relay = HostRelay(tmp_path / "gateway.sock", port, mine.api_key)
    yield relay, mine, other, tmp_path / "relay.db"
    relay.close()
    served.stop()
    stub.stop()


def _exchange(path: Path, data: bytes) -> tuple[int, dict, bytes]:
    """Send raw bytes over the socket; the status, the JSON body (or {}) and the whole answer."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(str(path))
    s.sendall(data)
    answer = b""
    while chunk := s.recv(65536):
        answer += chunk
    s.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = {}
    return status, parsed, answer


def _chat(
    key: str | None, *, header: str = "authorization", extra: str = "", body: bytes | None = None
) -> bytes:
    payload = (
        body if body is not None else json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    )
    auth = ""
    if key is not None:
        auth = f"{header}: {'Bearer ' if header == 'authorization' else ''}{key}\r\n"
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n{auth}"
        f"content-length: {len(payload)}\r\n{extra}\r\n"
    ).encode() + payload


def _calls(db: Path) -> dict[str, int]:
    with Store.open(str(db)) as store:
        return {e.task or "": len(store.list_calls(e.id)) for e in store.list_episodes(limit=None) if e.task}


def test_only_the_episodes_own_key_passes_the_bridge(gateway):
    relay, mine, other, db = gateway
    status, body, answer = _exchange(relay.path, _chat(mine.api_key))
    assert status == 200, answer
    assert body["choices"][0]["message"]["content"]
    status, body, _ = _exchange(relay.path, _chat(mine.api_key, header="x-api-key"))
    assert status == 200
    # a streamed answer ends the connection at its last chunk (the gateway would keep it open)
    stream = json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
    status, _, answer = _exchange(relay.path, _chat(mine.api_key, body=stream))
    assert status == 200 and answer.endswith(b"0\r\n\r\n") and b"data: [DONE]" in answer, answer[-200:]

    # another episode's key, valid at the gateway, is useless from this sandbox: refused at the socket
    status, body, _ = _exchange(relay.path, _chat(other.api_key))
    assert status == 403 and body["error"]["code"] == "episode_key_mismatch", body
    status, body, _ = _exchange(relay.path, _chat(None))
    assert status == 403 and body["error"]["code"] == "episode_key_required", body
    # every key a request carries must be this episode's: one of each is refused
    status, body, _ = _exchange(relay.path, _chat(mine.api_key, extra=f"x-api-key: {other.api_key}\r\n"))
    assert status == 403 and body["error"]["code"] == "episode_key_mismatch"
    # an Anthropic path gets Anthropic's error shape
    req = _chat(other.api_key, header="x-api-key").replace(b"/v1/chat/completions", b"/v1/messages")
    status, body, _ = _exchange(relay.path, req)
    assert status == 403 and body["type"] == "error" and body["error"]["type"] == "permission_error", body

    # a second request behind the first, with the other key, never reaches the gateway
    status, _, answer = _exchange(relay.path, _chat(mine.api_key) + _chat(other.api_key))
    assert status == 200 and answer.count(b"HTTP/1.1 ") == 1, answer
    chunked = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        + f"authorization: Bearer {mine.api_key}\r\ntransfer-encoding: chunked\r\n\r\n".encode()
    )
    payload = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
    chunked += f"{len(payload):x}\r\n".encode() + payload + b"\r\n0\r\n\r\n" + _chat(other.api_key)
    status, _, answer = _exchange(relay.path, chunked)
    assert status == 200 and answer.count(b"HTTP/1.1 ") == 1, answer

    for extra, code in [
        ("transfer-encoding: chunked\r\n", "bad_framing"),  # beside Content-Length: a smuggling shape
        ("content-length: 3\r\n", "bad_framing"),  # two lengths
        ("upgrade: websocket\r\nconnection: upgrade\r\n", "upgrade_not_served"),
    ]:
        status, body, _ = _exchange(relay.path, _chat(mine.api_key, extra=extra))
        assert status == 400 and body["error"]["code"] == code, (extra, body)
    status, _, _ = _exchange(relay.path, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    assert status == 400

    assert _calls(db) == {"mine": 5, "other": 0}
    assert relay.refused == {
        "episode_key_mismatch": 3,
        "episode_key_required": 1,
        "bad_framing": 2,
        "upgrade_not_served": 1,
        "bad_request": 1,
    }


def test_a_client_that_leaves_mid_answer_does_not_hold_the_relay(gateway):
    relay, mine, _, _ = gateway
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(relay.path))
    s.sendall(_chat(mine.api_key)[:40])  # half a head, then gone
    s.close()
    done = threading.Event()

    def ok() -> None:
        assert _exchange(relay.path, _chat(mine.api_key))[0] == 200
        done.set()

    t = threading.Thread(target=ok)
    t.start()
    t.join(60)
    assert done.is_set()
