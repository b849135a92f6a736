"""A loopback TLS WebSocket stand-in for OpenAI's Responses WebSocket (`wss://api.openai.com/v1/responses`),
under the test CA, speaking the protocol as Codex does (see polarproxy/capture/intercept/websocket.py).

Each `response.create` text message is answered with Responses stream events, one text message each.
What it answers depends on the request:
- `generate: false` (Codex's warm-up): an empty response (created, then completed with no output);
- input without a tool's output: a function call `ls` (reasoning item, then the call), usage 30/9;
- input with a `function_call_output`: the text "Done." (deltas `Do`, `ne.`), usage 44/2;
- `metadata.standin == "drop"`: the first half of the text answer, then the TCP connection is aborted
  (no close frame: the proxy sees code 1006);
- `metadata.standin == "error"`: one `error` message with status 429, as the provider wraps errors.
`metadata.pause_s`: seconds of pause after the first event (a client looks at the store meanwhile).
`sent` keeps every message it sent, per socket, in order; `received` every message it got.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any

from standin import TestCA
from websockets.asyncio.server import ServerConnection, serve

REASONING = {
    "id": "rs_ws",
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": "List first."}],
    "encrypted_content": "gAAAAws",
}


def _call_item(n: int) -> dict[str, Any]:
    return {
        "id": f"fc_ws_{n}",
        "type": "function_call",
        "call_id": f"call_ws_{n}",
        "name": "ls",
        "arguments": '{"path": "."}',
        "status": "completed",
    }


def _text_item(n: int) -> dict[str, Any]:
    return {
        "id": f"msg_ws_{n}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
    }


def _response(rid: str, output: list[dict[str, Any]], usage: tuple[int, int], status: str) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": 1700000000,
        "status": status,
        "model": "gpt-5-2025-08-07",
        "output": output,
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1], "total_tokens": sum(usage)},
    }


def answer(request: dict[str, Any], n: int) -> tuple[list[dict[str, Any]], bool]:
    """(events, abort after them) for the n-th request on the stand-in."""
    rid = f"resp_ws_{n}"
    fault = (request.get("metadata") or {}).get("standin")
    if fault == "error":
        return [
            {
                "type": "error",
                "status": 429,
                "error": {"type": "usage_limit_reached", "message": "The usage limit has been reached"},
            }
        ], False
    created = {"type": "response.created", "response": _response(rid, [], (0, 0), "in_progress")}
    if request.get("generate") is False:
        return [
            created,
            {"type": "response.completed", "response": _response(rid, [], (0, 0), "completed")},
        ], False
    answers_a_tool = any(
        isinstance(i, dict) and i.get("type") == "function_call_output" for i in request["input"]
    )
    if answers_a_tool or fault == "drop":
        item = _text_item(n)
        events = [
            created,
            {"type": "response.output_item.added", "output_index": 0, "item": {**item, "content": []}},
            {"type": "response.output_text.delta", "output_index": 0, "delta": "Do"},
            {"type": "response.output_text.delta", "output_index": 0, "delta": "ne."},
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {"type": "response.completed", "response": _response(rid, [item], (44, 2), "completed")},
        ]
        if fault == "drop":
            return events[:3], True
        return events, False
    items = [REASONING, _call_item(n)]
    return [
        created,
        {"type": "response.output_item.done", "output_index": 0, "item": items[0]},
        {"type": "response.output_item.added", "output_index": 1, "item": {**items[1], "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": '{"path": "."}'},
        {"type": "response.output_item.done", "output_index": 1, "item": items[1]},
        {"type": "codex.rate_limits", "plan_type": "plus"},
        {"type": "response.completed", "response": _response(rid, items, (30, 9), "completed")},
    ], False


@dataclass
class WsStandIn:
    """The WebSocket server (its own event loop in a thread) on 127.0.0.1:`port`."""

    ca: TestCA
    sent: list[list[str]] = field(default_factory=list)  # per socket, in order
    received: list[dict[str, Any]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.ca.server_cert, self.ca.server_key)
        self._count = 0
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def main() -> None:
            self._stop = asyncio.Event()
            async with serve(self._serve, "127.0.0.1", 0, ssl=ctx) as server:
                self.port = next(iter(server.sockets)).getsockname()[1]
                ready.set()
                await self._stop.wait()

        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(main(),), daemon=True)
        self._thread.start()
        ready.wait(10)

    async def _serve(self, ws: ServerConnection) -> None:
        sent: list[str] = []
        self.sent.append(sent)
        assert ws.request is not None
        self.paths.append(ws.request.path)
        self.headers.append(dict(ws.request.headers.raw_items()))
        async for raw in ws:
            request = json.loads(raw)
            self.received.append(request)
            if request.get("type") != "response.create":
                continue
            self._count += 1
            events, abort = answer(request, self._count)
            pause = float((request.get("metadata") or {}).get("pause_s") or 0)
            for i, ev in enumerate(events):
                text = json.dumps(ev)
                sent.append(text)
                await ws.send(text)
                await asyncio.sleep(pause if i == 0 else 0.002)
            if abort:
                ws.transport.abort()  # no close frame: the connection just ends
                return

    def resolve_args(self) -> list[str]:
        return ["--resolve", f"api.openai.com=127.0.0.1:{self.port}"]

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
