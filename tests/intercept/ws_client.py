"""A Responses-over-WebSocket client as Codex drives one: `python ws_client.py DB OUT.json`.

It connects to wss://api.openai.com/v1/responses through HTTPS_PROXY (the `websockets` client reads the
proxy variables, and trusts SSL_CERT_FILE), sends `response.create`, reads events up to the final one,
answers the tool call on the same socket with `previous_response_id` and only the new input item (as
Codex does on a reused socket), then opens a socket whose answer is cut off and one that gets an error.
It reads the store while it runs (T6) and writes every message it got to OUT.json.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from polarproxy.store.store import Store

URL = "wss://api.openai.com/v1/responses"
HEADERS = {"Authorization": "Bearer sk-ws-never-stored", "OpenAI-Beta": "responses_websockets=2026-02-06"}
FIRST = {
    "type": "response.create",
    "model": "gpt-5",
    "instructions": "You are a coding agent.",
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List files."}]}
    ],
    "tools": [{"type": "function", "name": "ls", "parameters": {"type": "object", "properties": {}}}],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "metadata": {"pause_s": "1"},  # the stand-in pauses after the first event: the store is read then
}
FINAL = ("response.completed", "response.failed", "response.incomplete", "error")


def statuses(store: Store) -> list[str]:
    return [c.status for c in store.list_calls(os.environ["POLARPROXY_EPISODE"])]


async def until_final(ws, got: list[str], store: Store, seen: dict, tag: str) -> dict:
    while True:
        text = await ws.recv()
        got.append(text)
        event = json.loads(text)
        if len(got) == 1:
            seen[f"{tag}_first"] = statuses(store)  # the call is on disk before its first event arrives
        if event["type"] in FINAL:
            seen[f"{tag}_final"] = statuses(store)  # and finished before its final event arrives
            return event


async def main() -> None:
    store = Store.open(sys.argv[1])
    seen: dict = {}
    got: list[list[str]] = [[], [], []]
    async with connect(URL, additional_headers=HEADERS) as ws:
        await ws.send(json.dumps(FIRST))
        done = await until_final(ws, got[0], store, seen, "one")
        rid = done["response"]["id"]
        await ws.send(json.dumps({"type": "response.processed", "response_id": rid}))
        call = next(i for i in done["response"]["output"] if i["type"] == "function_call")
        follow = {
            **FIRST,
            "previous_response_id": rid,
            "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "README.md"}],
        }
        n = len(got[0])
        await ws.send(json.dumps(follow))
        got_two: list[str] = []
        await until_final(ws, got_two, store, seen, "two")
        got[0] += got_two
        seen["split"] = n
    async with connect(URL, additional_headers=HEADERS) as ws:
        await ws.send(json.dumps({**FIRST, "metadata": {"standin": "drop", "pause_s": "1"}}))
        try:
            await until_final(ws, got[1], store, seen, "drop")
        except ConnectionClosed as e:
            seen["drop_closed"] = e.rcvd.code if e.rcvd else None
    async with connect(URL, additional_headers=HEADERS) as ws:
        await ws.send(json.dumps({**FIRST, "metadata": {"standin": "error"}}))
        await until_final(ws, got[2], store, seen, "error")
    seen["got"] = got
    with open(sys.argv[2], "w") as f:
        f.write(json.dumps(seen))


if __name__ == "__main__":
    asyncio.run(main())
