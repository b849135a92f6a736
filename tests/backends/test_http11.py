"""The backend leg's HTTP/1.1 client (backends/http11.py) against a raw asyncio server on loopback."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from polarproxy.backends.base import GenerateParams
from polarproxy.backends.http11 import HTTPClient, HTTPError
from polarproxy.backends.sglang import SGLangBackend


class Server:
    """Answers each request on a connection with `answer(writer)`; counts connections."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.connections = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.decode().split("\r\n")[1:]:
                    k, _, v = line.partition(":")
                    if k.strip().lower() == "content-length":
                        length = int(v)
                await reader.readexactly(length)
                await self.answer(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def sse_answer(writer: asyncio.StreamWriter, *, gap_s: float = 0.0, tokens: int = 3) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    for n in range(1, tokens + 1):
        await asyncio.sleep(gap_s)
        done = n == tokens
        meta = {
            "id": "r",
            "finish_reason": {"type": "length"} if done else None,
            "prompt_tokens": 1,
            "completion_tokens": n,
            "output_token_logprobs": [[-0.5, 10 + i, None] for i in range(n)],
        }
        body = {"text": "", "output_ids": [10 + i for i in range(n)], "meta_info": meta}
        writer.write(chunk(b"data: " + orjson.dumps(body) + b"\n\n"))
        await writer.drain()
    writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()


async def test_a_streamed_answer_read_to_done_leaves_its_connection_for_the_next_call():
    server = Server(sse_answer)
    async with server as url:
        backend = SGLangBackend(url)
        try:
            for _ in range(3):
                gens = [g async for g in backend.generate([1], GenerateParams(max_new_tokens=3), stream=True)]
                assert gens[-1].output_ids == [10, 11, 12] and gens[-1].finish_reason == "length"
        finally:
            await backend.aclose()
    assert server.connections == 1


async def test_a_backend_that_goes_silent_times_out_and_one_that_keeps_sending_does_not():
    async def stall(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunk(b"first"))
        await writer.drain()
        await asyncio.sleep(30)

    async with Server(stall) as url:
        client = HTTPClient(url, read_timeout=0.5)
        response = await client.request("POST", "/generate", b"{}")
        got = []
        with pytest.raises(HTTPError, match="sent nothing for"):
            async for data in response.iter_chunks():
                got.append(data)
        assert got == [b"first"]
        await response.close()

    # 1.5 s in all, more than the timeout, but never 1 s without a chunk (gaps of 0.1 s: a 10x margin)
    async with Server(lambda w: sse_answer(w, gap_s=0.1, tokens=15)) as url:
        client = HTTPClient(url, read_timeout=1.0)
        response = await client.request("POST", "/generate", b"{}")
        body = await response.read()
        assert body.count(b"data: ") == 16
        await response.close()
        await client.aclose()
