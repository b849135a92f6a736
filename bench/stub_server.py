"""The fixed-time backend double (`polarproxy.backends.stub`) as its own process, for the benchmark.

    python bench/stub_server.py --output-ids '[1,2,3]' --text 'abc' --first-token-ms 20 --per-token-ms 1

Prints `stub: listening on http://127.0.0.1:PORT` to stderr when ready; runs until SIGINT/SIGTERM.
One extra route lets the benchmark change the timing between phases without restarting the targets
(they all point at this one stub): `POST /_bench/timing {"first_token_ms": 0, "per_token_ms": 0}`.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import orjson

from polarproxy.backends.stub import StubBackend, StubConfig


class BenchStub(StubBackend):
    async def _route(self, method: str, path: str, body: dict, w: asyncio.StreamWriter) -> bool:
        if method == "POST" and path == "/_bench/timing":
            for key in ("first_token_ms", "per_token_ms"):
                if key in body:
                    setattr(self.cfg, key, float(body[key]))
            self.cfg.calls -= 1  # control calls are not backend calls
            return self._send(
                w,
                200,
                orjson.dumps(
                    {"first_token_ms": self.cfg.first_token_ms, "per_token_ms": self.cfg.per_token_ms}
                ),
            )
        if method == "GET" and path == "/_bench/calls":
            self.cfg.calls -= 1
            return self._send(w, 200, orjson.dumps({"calls": self.cfg.calls}))
        return await super()._route(method, path, body, w)


async def main(args: argparse.Namespace) -> None:
    cfg = StubConfig(
        output_ids=orjson.loads(args.output_ids),
        text=args.text,
        first_token_ms=args.first_token_ms,
        per_token_ms=args.per_token_ms,
    )
    stub = BenchStub(cfg)
    port = await stub.start(args.host, args.port)
    print(f"stub: listening on http://{args.host}:{port}", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    # Not stub.stop(): on 3.12 Server.wait_closed() waits for every open keep-alive connection (the
    # proxies hold some), so close the listener and let asyncio.run cancel the connection handlers.
    if stub._server is not None:
        stub._server.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output-ids", required=True, help="JSON list of the token IDs every answer carries.")
    p.add_argument("--text", default="", help="The answer text (what /v1/chat/completions returns).")
    p.add_argument("--first-token-ms", type=float, default=20.0)
    p.add_argument("--per-token-ms", type=float, default=1.0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    asyncio.run(main(p.parse_args()))
