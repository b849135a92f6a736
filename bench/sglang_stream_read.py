"""What reading one streamed SGLang answer costs the proxy, cumulative against incremental events.

    python bench/sglang_stream_read.py [--tokens 256,1024,4096] [--rounds 3] [--json OUT]

SGLang streams `POST /generate` cumulatively unless its server runs with `--incremental-streaming-output`:
each event repeats every output ID and `[logprob, id, text]` triple so far, so an answer of n tokens is
O(n²) bytes. This times polarproxy's own reading of such a stream (`SGLangBackend._read_stream`: the SSE
decoder, the events read by their new elements, backends/sglang_tail.py, and the generations it yields)
over the same answer as SGLang 0.5 would send it both ways, in memory, no socket: CPU per answer and per
token, best of `--rounds`. Both readings must give the same output IDs and logprobs (asserted).

The figures show how far the cumulative reading is from linear (per-token CPU at the longest answer over
the shortest); the incremental one is the floor. Before the tail reading (a whole parse of every event),
one 4,096-token answer took ~7 s of CPU (docs/benchmarks-history.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson

from polarproxy.backends.sglang import SGLangBackend


def events(n: int, *, cumulative: bool) -> list[bytes]:
    """An n-token answer as SGLang 0.5 streams it (`text`, `output_ids`, `meta_info` with the triples)."""
    out = []
    for k in range(1, n + 1):
        lo = 0 if cumulative else k - 1
        done = {"type": "stop", "matched": 2} if k == n else None
        event = {
            "text": "tok " * (k - lo),
            "output_ids": list(range(100_000 + lo, 100_000 + k)),
            "meta_info": {
                "id": "bench",
                "finish_reason": done,
                "prompt_tokens": 20,
                "completion_tokens": k,
                "cached_tokens": 0,
                "weight_version": "w0",
                "output_token_logprobs": [[-0.123456789 - i * 1e-6, 100_000 + i, None] for i in range(lo, k)],
            },
        }
        out.append(b"data: " + orjson.dumps(event) + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


class _Response:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk

    async def finish(self) -> None:
        pass


async def _read(chunks: list[bytes]) -> Any:
    backend = SGLangBackend.__new__(SGLangBackend)  # no connection: only the stream reading is timed
    backend.url = "http://127.0.0.1:0"
    last = None
    async for gen in backend._read_stream(_Response(chunks)):  # type: ignore[arg-type]
        last = gen
    return last


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="256,1024,4096", help="answer lengths, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    for n in (int(x) for x in args.tokens.split(",")):
        row: dict[str, Any] = {"tokens": n}
        outputs = []
        for kind in ("cumulative", "incremental"):
            chunks = events(n, cumulative=kind == "cumulative")
            best, last = float("inf"), None
            for _ in range(args.rounds):
                t0 = time.process_time()
                last = asyncio.run(_read(chunks))
                best = min(best, time.process_time() - t0)
            outputs.append((list(last.output_ids), list(last.logprobs)))
            row[kind] = {
                "bytes": sum(map(len, chunks)),
                "cpu_s": round(best, 4),
                "cpu_us_per_token": round(best / n * 1e6, 1),
            }
        assert outputs[0] == outputs[1] and len(outputs[0][0]) == n, "the two readings differ"
        row["cumulative_over_incremental"] = round(
            row["cumulative"]["cpu_s"] / row["incremental"]["cpu_s"], 2
        )
        rows.append(row)
    first, last_row = rows[0], rows[-1]
    growth = last_row["cumulative"]["cpu_us_per_token"] / first["cumulative"]["cpu_us_per_token"]
    print(
        f"SGLang stream reading, CPU per answer (best of {args.rounds}), {time.strftime('%Y-%m-%dT%H:%M:%S%z')}"
    )
    print(
        f"{'tokens':>7} {'cumulative MB':>14} {'cumulative s':>13} {'us/token':>9} {'incremental s':>14} {'us/token':>9} {'ratio':>6}"
    )
    for r in rows:
        c, i = r["cumulative"], r["incremental"]
        print(
            f"{r['tokens']:>7} {c['bytes'] / 1e6:>14.1f} {c['cpu_s']:>13.3f} {c['cpu_us_per_token']:>9.0f} "
            f"{i['cpu_s']:>14.3f} {i['cpu_us_per_token']:>9.0f} {r['cumulative_over_incremental']:>5.1f}x"
        )
    print(
        f"cumulative per-token CPU, {last_row['tokens']} over {first['tokens']} tokens: {growth:.1f}x "
        "(1x would be linear; the bytes SGLang sends grow as n²)"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "per_token_growth": round(growth, 2)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
