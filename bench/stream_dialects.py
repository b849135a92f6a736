"""Streaming through polarproxy in each wire format, against the backend's own stream, side by side.

    python bench/stream_dialects.py [--tokens 256] [--rounds 40] [--json OUT]

One stub backend (bench/stub_server.py, its own process) streams a fixed answer of `--tokens` token IDs
(text tokens, then a stop token), the first after FIRST_TOKEN_MS and each further one PER_TOKEN_MS
later. Five targets are timed in one run, request by request in a new shuffled order each round:

  direct            the stub's own `POST /generate` stream (SGLang's native API, what polarproxy calls)
  mitmproxy         the same stream through bare mitmproxy (`mitmdump --mode reverse:STUB`, SSE streamed):
                    the baseline each format's added TTFT is set against, as in bench/proxy_overhead.py
  openai_chat       polarproxy `POST /v1/chat/completions` (stream)
  openai_responses  polarproxy `POST /v1/responses` (stream)
  anthropic         polarproxy `POST /v1/messages` (stream)
  gemini            polarproxy `POST /v1beta/models/M:streamGenerateContent?alt=sse`

Per call the client notes when each content-bearing SSE event arrives (a text delta in that format;
for direct, an event whose `output_ids` grew) and in how many separate network reads they came.
Figures per format: time to first token (TTFT) and the mean gap between content chunks, each minus
direct's from the same run ("added"), and the added TTFT over bare mitmproxy's ("ratio", the goal: these
machines are noisy, so the goal is a ratio within one run); polarproxy's own CPU per chunk (its threads' on-CPU time from
/proc/PID/task/*/schedstat around each call, one call in flight at a time: clock ticks of /proc/PID/stat
are too coarse for a short run's calls); and chunks seen by the client as a share of tokens generated. A
proxy that buffered would show one read and a share near 0; polarproxy must stream token by token.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proxy_overhead import (
    REPO,
    Proc,
    log,
    ms,
    pct,
    spawn,
    spawn_bare_mitmproxy,
    thread_cpu_ns,
    tiny_model,
    wait_listening,
)

MODEL = "tiny"
FIRST_TOKEN_MS = 20.0
PER_TOKEN_MS = 2.0
DIALECTS = ("openai_chat", "openai_responses", "anthropic", "gemini")
TARGETS = ("direct", "mitmproxy", *DIALECTS)
# Goals for polarproxy, per format: an absolute added TTFT (on this VM bare mitmproxy alone adds
# more), the same ratio to bare mitmproxy as proxy_overhead.py's goal for streamed first content, and streaming per token.
GOALS = {"added_ttft_p50_ms": 2.0, "added_ttft_ratio": 1.5, "chunk_share_min": 0.90}
PROMPT = "Say the fixed answer."
WORDS = "the quick brown fox jumps over a lazy dog while seven small birds sing in the old green tree "


def request(target: str, max_tokens: int) -> tuple[str, dict[str, Any]]:
    """Path and body of one streamed call of `target`."""
    user = [{"role": "user", "content": PROMPT}]
    if target == "openai_chat":
        return "/v1/chat/completions", {
            "model": MODEL,
            "messages": user,
            "max_tokens": max_tokens,
            "stream": True,
        }
    if target == "openai_responses":
        return "/v1/responses", {
            "model": MODEL,
            "input": PROMPT,
            "max_output_tokens": max_tokens,
            "stream": True,
        }
    if target == "anthropic":
        return "/v1/messages", {"model": MODEL, "messages": user, "max_tokens": max_tokens, "stream": True}
    if target == "gemini":
        return f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse", {
            "contents": [{"role": "user", "parts": [{"text": PROMPT}]}],
            "generationConfig": {"maxOutputTokens": max_tokens},
        }
    raise ValueError(f"unknown target {target!r}; known: {', '.join(TARGETS)}")


# -- what counts as a content chunk in each format -------------------------------------------------


def _chat(ev: dict[str, Any], _state: dict[str, Any]) -> str:
    choices = ev.get("choices") or [{}]
    return (choices[0].get("delta") or {}).get("content") or ""


def _responses(ev: dict[str, Any], _state: dict[str, Any]) -> str:
    return ev.get("delta") or "" if ev.get("type") == "response.output_text.delta" else ""


def _anthropic(ev: dict[str, Any], _state: dict[str, Any]) -> str:
    delta = ev.get("delta") or {}
    if ev.get("type") == "content_block_delta" and delta.get("type") == "text_delta":
        return delta.get("text") or ""
    return ""


def _gemini(ev: dict[str, Any], _state: dict[str, Any]) -> str:
    cands = ev.get("candidates") or [{}]
    parts = (cands[0].get("content") or {}).get("parts") or []
    return "".join(p.get("text", "") for p in parts if not p.get("thought"))


def _direct(ev: dict[str, Any], state: dict[str, Any]) -> str:
    """SGLang streams cumulatively: a chunk is an event whose output_ids grew (stands for its tokens)."""
    n = len(ev.get("output_ids") or [])
    grew = n - state.get("n", 0)
    state["n"] = n
    return "#" * max(grew, 0)


CONTENT: dict[str, Callable[[dict[str, Any], dict[str, Any]], str]] = {
    "direct": _direct,
    "mitmproxy": _direct,
    "openai_chat": _chat,
    "openai_responses": _responses,
    "anthropic": _anthropic,
    "gemini": _gemini,
}


@dataclass
class Sample:
    ok: bool
    ttft: float  # request sent -> first content chunk
    total: float
    chunks: int  # content-bearing SSE events
    content_reads: int  # network reads that carried at least one content chunk
    gap: float  # mean time between content chunks (first to last / (chunks - 1))
    text: str
    cpu: float  # polarproxy process CPU seconds during the call (0 for direct)


async def call(client: httpx.AsyncClient, url: str, body: bytes, target: str, cpu_pid: int | None) -> Sample:
    read_content = CONTENT[target]
    state: dict[str, Any] = {}
    cpu0 = thread_cpu_ns(cpu_pid) if cpu_pid else 0
    t0 = time.perf_counter()
    first = last = None
    chunks = content_reads = 0
    buf = b""
    parts: list[str] = []
    status = 0
    async with client.stream("POST", url, content=body, headers={"content-type": "application/json"}) as r:
        status = r.status_code
        async for raw in r.aiter_raw():
            buf += raw
            got = False
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if not payload or payload == b"[DONE]":
                        continue
                    text = read_content(orjson.loads(payload), state)
                    if text:
                        now = time.perf_counter() - t0
                        first = now if first is None else first
                        last = now
                        chunks += 1
                        got = True
                        parts.append(text)
            content_reads += got
    total = time.perf_counter() - t0
    cpu = (thread_cpu_ns(cpu_pid) - cpu0) / 1e9 if cpu_pid else 0.0
    ok = status == 200 and first is not None
    first = total if first is None else first
    gap = ((last or first) - first) / (chunks - 1) if chunks > 1 else 0.0
    return Sample(ok, first, total, chunks, content_reads, gap, "".join(parts), cpu)


# -- the run ---------------------------------------------------------------------------------------


def answer_ids(model_dir: Path, tokens: int) -> tuple[list[int], str, list[int]]:
    """`tokens` output IDs: text tokens then a stop token; their text; and a prompt for /generate."""
    from polarproxy.render.renderer import Renderer

    r = Renderer(model_dir)
    words = WORDS
    while len(r.encode(words)) < tokens:
        words += WORDS
    text_ids = r.encode(words)[: max(tokens - 1, 1)]
    return [*text_ids, r.stop_token_ids[0]], r.decode(text_ids), r.encode(PROMPT)


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    model_dir = tiny_model()
    output_ids, text, prompt_ids = answer_ids(model_dir, args.tokens)
    procs: dict[str, Proc] = {}
    try:
        stub, stub_url = spawn(
            "stub",
            [
                sys.executable,
                str(REPO / "bench" / "stub_server.py"),
                "--output-ids",
                orjson.dumps(output_ids).decode(),
                "--text",
                text,
                "--first-token-ms",
                str(args.first_token_ms),
                "--per-token-ms",
                str(args.per_token_ms),
            ],
            re.compile(r"listening on (http://[\d.]+:\d+)"),
            timeout=30,
        )
        procs["stub"] = stub
        argv = [sys.executable, "-m", "polarproxy", "serve", "--backend", stub_url]
        argv += ["--model", str(model_dir), "--db", str(work / "stream-bench.db"), "--port", "0"]
        pp, pp_url = spawn("polarproxy", argv, re.compile(r"recording on (http://[\d.]+:\d+)"))
        procs["polarproxy"] = pp
        mitm, mitm_port = spawn_bare_mitmproxy(work, stub_url)
        procs["mitmproxy"] = mitm
        wait_listening(mitm, mitm_port)
        log(
            f"bench: {len(output_ids)} tokens per answer, first after {args.first_token_ms:g} ms, then "
            f"{args.per_token_ms:g} ms each; {args.rounds} interleaved rounds of {len(TARGETS)} targets"
        )
        direct_body = orjson.dumps(
            {"input_ids": prompt_ids, "sampling_params": {"max_new_tokens": args.tokens}, "stream": True}
        )
        targets: dict[str, tuple[str, bytes, int | None]] = {
            "direct": (stub_url + "/generate", direct_body, None),
            "mitmproxy": (f"http://127.0.0.1:{mitm_port}/generate", direct_body, mitm.popen.pid),
        }
        for d in DIALECTS:
            path, body = request(d, args.tokens)
            targets[d] = (pp_url + path, orjson.dumps(body), pp.pid)
        limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)
        clients = {t: httpx.AsyncClient(timeout=60, limits=limits, trust_env=False) for t in TARGETS}
        samples: dict[str, list[Sample]] = {t: [] for t in TARGETS}
        rng = random.Random(0)
        try:
            for _ in range(args.warmup):
                for t in TARGETS:
                    await call(clients[t], *targets[t][:2], t, targets[t][2])
            gc.collect()
            gc.disable()
            for _ in range(args.rounds):
                order = list(TARGETS)
                rng.shuffle(order)
                for t in order:
                    samples[t].append(await call(clients[t], *targets[t][:2], t, targets[t][2]))
            gc.enable()
        finally:
            for c in clients.values():
                await c.aclose()
    finally:
        for p in procs.values():
            p.stop()
    result = summarise(args, samples, output_ids, text, t_start)
    result["host"]["loadavg_before"] = [round(x, 2) for x in load_before]
    return result


def summarise(
    args: argparse.Namespace, samples: dict[str, list[Sample]], output_ids: list[int], text: str, t0: float
) -> dict[str, Any]:
    tokens = len(output_ids)
    per: dict[str, dict[str, Any]] = {}
    for t, ss in samples.items():
        good = [s for s in ss if s.ok]
        per[t] = {
            "n": len(ss),
            "errors": len(ss) - len(good),
            "text_ok": all(s.text == text for s in good) if t in DIALECTS else None,
            "ttft_p50_ms": ms(pct([s.ttft for s in good], 50)),
            "ttft_p99_ms": ms(pct([s.ttft for s in good], 99)),
            "total_p50_ms": ms(pct([s.total for s in good], 50)),
            "gap_p50_ms": ms(pct([s.gap for s in good], 50)),
            "chunks_min": min((s.chunks for s in good), default=0),
            "content_reads_min": min((s.content_reads for s in good), default=0),
            "content_reads_median": statistics.median([s.content_reads for s in good]) if good else 0,
            "chunk_share_min": round(min((s.content_reads for s in good), default=0) / tokens, 3),
            "cpu_ms_per_chunk": (
                round(1000 * sum(s.cpu for s in good) / max(sum(s.chunks for s in good), 1), 4)
                if t != "direct"
                else None
            ),
        }
    direct = per["direct"]
    added = {}
    for d in ("mitmproxy", *DIALECTS):
        paired = [
            s.ttft - b.ttft for s, b in zip(samples[d], samples["direct"], strict=True) if s.ok and b.ok
        ]
        added[d] = {
            "ttft_p50_ms": round(per[d]["ttft_p50_ms"] - direct["ttft_p50_ms"], 3),
            "ttft_p99_ms": round(per[d]["ttft_p99_ms"] - direct["ttft_p99_ms"], 3),
            "ttft_paired_p50_ms": ms(pct(paired, 50)),
            "per_chunk_ms": round(per[d]["gap_p50_ms"] - direct["gap_p50_ms"], 4),
        }
    bare = added["mitmproxy"]["ttft_p50_ms"]
    for d in DIALECTS:
        added[d]["ttft_ratio"] = round(added[d]["ttft_p50_ms"] / bare, 3) if bare > 0 else None
    goals = {
        d: {
            "added_ttft_p50_ms": {
                "value": added[d]["ttft_p50_ms"],
                "goal": f"<= {GOALS['added_ttft_p50_ms']:g}",
                "met": added[d]["ttft_p50_ms"] <= GOALS["added_ttft_p50_ms"],
            },
            "added_ttft_ratio": {
                "value": added[d]["ttft_ratio"],
                "goal": f"<= {GOALS['added_ttft_ratio']:g}",
                "met": added[d]["ttft_ratio"] is not None
                and added[d]["ttft_ratio"] <= GOALS["added_ttft_ratio"],
            },
            "chunk_share_min": {
                "value": per[d]["chunk_share_min"],
                "goal": f">= {GOALS['chunk_share_min']:g}",
                "met": per[d]["chunk_share_min"] >= GOALS["chunk_share_min"],
            },
        }
        for d in DIALECTS
    }
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {"cpus": os.cpu_count(), "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
        "config": {
            "tokens": tokens,
            "first_token_ms": args.first_token_ms,
            "per_token_ms": args.per_token_ms,
            "rounds": args.rounds,
            "warmup": args.warmup,
        },
        "targets": per,
        "added": added,
        "goals": goals,
        "elapsed_s": round(time.perf_counter() - t0, 1),
    }


def table(r: dict[str, Any]) -> str:
    cfg, per, added = r["config"], r["targets"], r["added"]
    w = [
        f"polarproxy streaming per wire format, {r['date']}, {r['host']['cpus']} CPUs; {cfg['tokens']} tokens, "
        f"first {cfg['first_token_ms']:g} ms then {cfg['per_token_ms']:g} ms/token; {cfg['rounds']} rounds",
        "",
        f"{'':30}" + "".join(f"{t:>17}" for t in TARGETS),
    ]

    def row(label: str, vals: list[Any], fmt: str = "{:>17.2f}") -> None:
        w.append(f"{label:30}" + "".join(fmt.format(v) if v is not None else f"{'-':>17}" for v in vals))

    row("TTFT p50 ms", [per[t]["ttft_p50_ms"] for t in TARGETS])
    row("TTFT p99 ms", [per[t]["ttft_p99_ms"] for t in TARGETS])
    others = ("mitmproxy", *DIALECTS)
    row("  added TTFT p50 ms", [None, *(added[d]["ttft_p50_ms"] for d in others)], "{:>+17.2f}")
    row("  added TTFT p99 ms", [None, *(added[d]["ttft_p99_ms"] for d in others)], "{:>+17.2f}")
    row("  added TTFT / mitmproxy's", [None, None, *(added[d]["ttft_ratio"] for d in DIALECTS)])
    row("chunk gap p50 ms", [per[t]["gap_p50_ms"] for t in TARGETS], "{:>17.3f}")
    row("  added per chunk ms", [None, *(added[d]["per_chunk_ms"] for d in others)], "{:>+17.3f}")
    row("proxy CPU ms per chunk", [per[t]["cpu_ms_per_chunk"] for t in TARGETS], "{:>17.3f}")
    row("total p50 ms", [per[t]["total_p50_ms"] for t in TARGETS])
    row("content chunks (min)", [per[t]["chunks_min"] for t in TARGETS], "{:>17}")
    row("reads with content (min)", [per[t]["content_reads_min"] for t in TARGETS], "{:>17}")
    row("  share of tokens (min)", [per[t]["chunk_share_min"] for t in TARGETS], "{:>17.3f}")
    row("errors", [per[t]["errors"] for t in TARGETS], "{:>17}")
    row("text as generated", [per[t]["text_ok"] for t in TARGETS], "{!s:>17}")
    w += ["", "goals (polarproxy, per format):"]
    for d, gs in r["goals"].items():
        for k, g in gs.items():
            w.append(
                f"  {d:17} {k:18} {g['value']!s:>8}  goal {g['goal']:>7}  {'met' if g['met'] else 'MISSED'}"
            )
    w.append(f"\nelapsed {r['elapsed_s']} s")
    return "\n".join(w)


def main() -> int:
    ap = argparse.ArgumentParser(
        description="Streamed calls through polarproxy in each wire format vs direct."
    )
    ap.add_argument("--tokens", type=int, default=256, help="Tokens per answer, stop token included.")
    ap.add_argument("--rounds", type=int, default=40, help="Timed rounds (each round calls every target).")
    ap.add_argument("--warmup", type=int, default=3, help="Untimed rounds first.")
    ap.add_argument("--first-token-ms", type=float, default=FIRST_TOKEN_MS)
    ap.add_argument("--per-token-ms", type=float, default=PER_TOKEN_MS)
    ap.add_argument("--json", type=Path, help="Write every figure to this JSON file.")
    args = ap.parse_args()
    if args.tokens < 2 or args.rounds < 1 or args.warmup < 0:
        ap.error(
            f"--tokens must be >= 2 (got {args.tokens}), --rounds >= 1 (got {args.rounds}), --warmup >= 0"
        )
    with tempfile.TemporaryDirectory(prefix="polarproxy-stream-bench-") as work:
        result = asyncio.run(run(args, Path(work)))
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
        log(f"bench: wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
