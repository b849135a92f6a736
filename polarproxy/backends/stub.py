"""A fixed-time backend double for benchmarks and fault tests (no model, no torch).

It answers SGLang's `POST /generate` (streamed cumulatively or not) and OpenAI's
`POST /v1/chat/completions` with a fixed list of token IDs after a fixed delay, so that the same
answer can be fetched directly, through a bare mitmproxy, and through polarproxy, side by side.
Faults on demand: `status` answers every call with that HTTP error; `die_after` drops the connection
after that many streamed tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import orjson


@dataclass
class StubConfig:
    output_ids: list[int]
    text: str = ""
    logprob: float = -0.5
    first_token_ms: float = 0.0
    per_token_ms: float = 0.0
    status: int = 200
    die_after: int | None = None
    weight_version: str = "stub-1"
    calls: int = field(default=0)


def _meta(cfg: StubConfig, n: int, prompt_tokens: int, done: bool) -> dict[str, object]:
    return {
        "id": "stub",
        "finish_reason": {"type": "stop", "matched": cfg.output_ids[-1]} if done else None,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": n,
        "cached_tokens": 0,
        "weight_version": cfg.weight_version,
        "output_token_logprobs": [[cfg.logprob, t, None] for t in cfg.output_ids[:n]],
    }


class StubBackend:
    def __init__(self, cfg: StubConfig) -> None:
        self.cfg = cfg
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._server = await asyncio.start_server(self._handle, host, port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server:
            self._server.close()
            for w in list(self._writers):  # open keep-alive connections would hold wait_closed() forever
                w.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                length = 0
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    if k.strip().lower() == "content-length":
                        length = int(v.strip())
                body = orjson.loads(await reader.readexactly(length)) if length else {}
                self.cfg.calls += 1
                if not await self._route(method, path, body, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _route(self, method: str, path: str, body: dict, w: asyncio.StreamWriter) -> bool:
        cfg = self.cfg
        if method == "GET" and path in ("/health", "/health_generate"):
            return self._send(w, 200, b"")
        if method == "GET" and path in ("/model_info", "/get_model_info"):
            return self._send(
                w,
                200,
                orjson.dumps(
                    {"model_path": "stub", "is_generation": True, "weight_version": cfg.weight_version}
                ),
            )
        if cfg.status != 200:
            return self._send(
                w, cfg.status, orjson.dumps({"error": {"message": f"stub failure {cfg.status}"}})
            )
        if method == "POST" and path == "/generate":
            prompt = len(body.get("input_ids") or [])
            if body.get("stream"):
                return await self._stream(
                    w,
                    lambda n, done: orjson.dumps(
                        {
                            "text": cfg.text,
                            "output_ids": cfg.output_ids[:n],
                            "meta_info": _meta(cfg, n, prompt, done),
                        }
                    ),
                )
            await self._wait_all()
            n = len(cfg.output_ids)
            return self._send(
                w,
                200,
                orjson.dumps(
                    {"text": cfg.text, "output_ids": cfg.output_ids, "meta_info": _meta(cfg, n, prompt, True)}
                ),
            )
        if method == "POST" and path.endswith("/chat/completions"):
            head = {"id": "chatcmpl-stub", "created": int(time.time()), "model": "stub"}
            if body.get("stream"):

                def chunk(n: int, done: bool) -> bytes:
                    delta = {"content": "x"} if not done else {}
                    return orjson.dumps(
                        {
                            **head,
                            "object": "chat.completion.chunk",
                            "choices": [
                                {"index": 0, "delta": delta, "finish_reason": "stop" if done else None}
                            ],
                        }
                    )

                return await self._stream(w, chunk)
            await self._wait_all()
            return self._send(
                w,
                200,
                orjson.dumps(
                    {
                        **head,
                        "object": "chat.completion",
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": cfg.text},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {
                            "prompt_tokens": 1,
                            "completion_tokens": len(cfg.output_ids),
                            "total_tokens": 1,
                        },
                    }
                ),
            )
        return self._send(w, 404, orjson.dumps({"error": {"message": f"no route {method} {path}"}}))

    async def _wait_all(self) -> None:
        total = self.cfg.first_token_ms + self.cfg.per_token_ms * max(len(self.cfg.output_ids) - 1, 0)
        if total:
            await asyncio.sleep(total / 1000)

    def _send(self, w: asyncio.StreamWriter, status: int, body: bytes) -> bool:
        ctype = b"application/json" if body else b"text/plain"
        w.write(
            b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
            % (status, ctype, len(body), body)
        )
        return True

    async def _stream(self, w: asyncio.StreamWriter, make: object) -> bool:
        cfg = self.cfg
        w.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        n_total = len(cfg.output_ids)
        for n in range(1, n_total + 1):
            await asyncio.sleep((cfg.first_token_ms if n == 1 else cfg.per_token_ms) / 1000)
            if cfg.die_after is not None and n > cfg.die_after:
                w.transport.abort()  # type: ignore[attr-defined]
                return False
            data = b"data: " + make(n, n == n_total) + b"\n\n"  # type: ignore[operator]
            w.write(b"%x\r\n%s\r\n" % (len(data), data))
            await w.drain()
        done = b"data: [DONE]\n\n"
        w.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        await w.drain()
        return True
