"""Responses over a WebSocket through `record --intercept` (Codex's transport for the real provider): a real
`websockets` client, through the proxy, to a loopback TLS WebSocket stand-in under the test CA."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import pytest
from intercept_run import HERE, Intercepted, run_intercept
from ws_standin import WsStandIn

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def ws_standin(test_ca) -> Iterator[WsStandIn]:
    server = WsStandIn(test_ca)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def ws_run(tmp_path_factory, standin, test_ca, ws_standin) -> tuple[Intercepted, dict]:
    tmp = tmp_path_factory.mktemp("ws")
    out = tmp / "got.json"
    rec = run_intercept(
        tmp,
        standin,
        test_ca,
        [sys.executable, str(HERE / "ws_client.py"), str(tmp / "intercept.db"), str(out)],
        *ws_standin.resolve_args(),  # api.openai.com: the WebSocket stand-in (the later --resolve wins)
    )
    return rec, json.loads(out.read_text())


def test_each_response_create_on_a_socket_is_one_call(ws_run):
    rec, _ = ws_run
    assert [(c.method, c.path, c.dialect, c.fidelity) for c in rec.calls] == [
        ("WEBSOCKET", "/v1/responses", "openai_responses", "text")
    ] * 4
    assert [c.status for c in rec.calls] == ["ok", "ok", "failed", "failed"]
    assert rec.summary["calls"] == 4


def test_a_websocket_call_records_its_tool_call_usage_and_events(ws_run):
    rec, _ = ws_run
    first = rec.calls[0]
    assert first.completion["tool_calls"] == [{"id": "call_ws_1", "name": "ls", "arguments": '{"path": "."}'}]
    assert first.completion["reasoning"] == "List first." and first.finish_reason == "tool_calls"
    assert (first.prompt_tokens, first.completion_tokens) == (30, 9)
    assert first.model == "gpt-5" and first.ttft_ms is not None
    events = [b for b in first.response_body.split("\n\n") if b]
    assert events[0].startswith("event: response.created\ndata: ")
    assert events[-1].startswith("event: response.completed\ndata: ")
    assert any(e.startswith("event: codex.rate_limits") for e in events)  # every event kept, unknown ones too
    assert '"type": "response.create"' in first.request_body


def test_a_follow_up_with_previous_response_id_is_recorded_with_the_whole_conversation(ws_run):
    rec, _ = ws_run
    second = rec.calls[1]
    assert second.completion["text"] == "Done." and second.finish_reason == "stop"
    assert (second.prompt_tokens, second.completion_tokens) == (44, 2)
    assert '"previous_response_id": "resp_ws_1"' in second.request_body  # the request as it was sent
    roles = [m["role"] for m in second.conversation["messages"]]
    assert roles == ["system", "user", "assistant", "tool"]  # instructions, the task, the call, its output
    assert second.conversation["messages"][2]["tool_calls"][0]["name"] == "ls"


def test_the_client_gets_every_event_unchanged_and_only_after_the_record(ws_run, ws_standin):
    _, seen = ws_run
    assert seen["got"][0] == ws_standin.sent[0]
    assert seen["got"][1] == ws_standin.sent[1]
    assert seen["got"][2] == ws_standin.sent[2]
    assert [r["type"] for r in ws_standin.received] == [
        "response.create",
        "response.processed",
        "response.create",
        "response.create",
        "response.create",
    ]
    # T6: in flight on disk before the first event reaches the client, finished before the final one does
    assert seen["one_first"] == ["in_flight"] and seen["one_final"] == ["ok"]
    assert seen["two_first"] == ["ok", "in_flight"] and seen["two_final"] == ["ok", "ok"]
    assert seen["drop_first"] == ["ok", "ok", "in_flight"]
    assert seen["error_final"] == ["ok", "ok", "failed", "failed"]


def test_a_socket_closed_mid_response_is_a_failed_call_with_the_close_code(ws_run):
    rec, seen = ws_run
    cut = rec.calls[2]
    assert cut.status == "failed"
    assert "the server closed the WebSocket (code 1006" in cut.error and "final event" in cut.error
    assert cut.completion["text"] == "Do"  # what arrived before the cut is kept
    assert "drop_final" not in seen  # the client never got a final event


def test_an_error_event_is_a_failed_call_with_the_providers_status_and_message(ws_run):
    rec, _ = ws_run
    err = rec.calls[3]
    assert err.status == "failed" and err.http_status == 429
    assert err.error == "provider error 429: The usage limit has been reached"


def test_no_key_of_the_socket_is_stored(ws_run, ws_standin):
    rec, _ = ws_run
    assert all(h.get("Authorization") == "Bearer sk-ws-never-stored" for h in ws_standin.headers)
    for c in rec.calls:
        assert {k.lower(): v for k, v in c.request_headers.items()}["authorization"] == "<redacted>"
    for f in rec.db.parent.glob("intercept.db*"):
        try:
            data = f.read_bytes()
        except FileNotFoundError:  # -wal/-shm go away when the store's last connection closes
            continue
        assert b"sk-ws-never-stored" not in data
