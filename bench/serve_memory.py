"""`polarproxy serve` memory with many open episodes at a long context, against a formula.

    python bench/serve_memory.py [--quick] [--episodes 256] [--context 32768] [--calls 3] [--json OUT]

A `polarproxy serve` subprocess (SQLite store in a temp dir, T2 on) in front of the stub backend
(bench/stub_server.py: the same short Qwen3 tool call every time), model folder: the tiny kit's tokenizer
with the real Qwen3 template. Episodes are opened one after another (4 at a time); each makes `--calls`
calls, the first ~1k tokens, the later ones each adding one large tool result, up to `--context` tokens at
the last (each call extends the one before: the bench fails otherwise). The serve process's VmRSS and
VmHWM (/proc/PID/status) are read after a small warm-up episode (the 0 point), then at 1/8, 1/4, 1/2 and
all of `--episodes` open episodes.

What the process keeps per episode (read from the code):

  T2 index (render/prefix.py PrefixIndex): the last CALLS_PER_EPISODE (8) finished calls of up to
    MAX_EPISODES (256) episodes, each a Turn: prompt and output IDs as int32 arrays (4 bytes a token) and
    the call's parsed Conversation (its messages' text as Python strings: ~ the request body's size).
  store (store/bases.py RecentCalls): the last CANDIDATES_PER_EPISODE (8) calls' committed token
    sequences packed (4 bytes a token), request body and conversation JSON, over all episodes at most
    CACHE_BYTES (128 MiB), least recently used episodes forgotten first.
  addon (dialects/resend.py ResentBodies): the last request body (16 KB and up) of each conversation of up
    to MAX_EPISODES (256) episodes, at most BODIES_PER_EPISODE (4) an episode and MAX_BYTES (64 MiB) in all,
    with the Messages they parsed to. The next request of the episode reuses
    those Messages where its bytes repeat them, so the index's calls share the messages they have in common.

So, with calls c of an episode (the last 8), P_c prompt tokens, B_c request body bytes, J_c conversation
JSON bytes, and M the retained size of the window's parsed Conversations together with the addon's last
body (measured here with tracemalloc, parsed in order as the addon does: a message the calls share counts
once, so M is about the last call's conversation and body when every call extends the one before):

    RSS(E) ~ base + S + min(E, 256) x (sum_c 4 P_c + M) + min(E x sum_c (4 P_c + B_c + J_c), 128 MiB)

With no message shared (every call branching from the history), M is at most sum_c M_c, M_c one call's
conversation alone, and the kept bodies add at most min(E x 4 x B, 64 MiB): the worst case's bound
(`worst_case`).

S is a one-time step reached in the first episodes (allocator arenas of the threads that render long
prompts, SQLite's page cache, buffers), not a per-episode cost. The bench computes both per-episode terms
from the requests it sent, reports each point against the formula without S (`formula_mb`, base = the
measured RSS at 0), and fits base + slope x E with and without the 0 point (the second fit's intercept -
base is S; its slope is what the per-episode terms should explain).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from long_context import CALL_ARGS, QWEN3, SYSTEM, TOOLS, TextSource
from proxy_overhead import REPO, Proc, log, mem_mb, spawn

CHAT_PATH = "/v1/chat/completions"
CONCURRENCY = 4
MIB = 1024 * 1024


def index_bounds() -> dict[str, int]:
    from polarproxy.dialects.resend import BODIES_PER_EPISODE, MAX_BYTES
    from polarproxy.render.prefix import CALLS_PER_EPISODE, MAX_EPISODES
    from polarproxy.store.bases import CACHE_BYTES, CANDIDATES_PER_EPISODE

    return {
        "index_calls_per_episode": CALLS_PER_EPISODE,
        "index_max_episodes": MAX_EPISODES,
        "store_calls_per_episode": CANDIDATES_PER_EPISODE,
        "store_cache_bytes": CACHE_BYTES,
        "resent_bodies_per_episode": BODIES_PER_EPISODE,
        "resent_max_bytes": MAX_BYTES,
    }


def conversation_bytes(body: bytes) -> tuple[int, int]:
    """(retained bytes of the parsed Conversation, bytes of its JSON as the store keeps it)."""
    from polarproxy.dialects.openai_chat import OpenAIChat

    tracemalloc.start()
    data = orjson.loads(body)  # the message strings the Conversation keeps are made here
    conv = OpenAIChat().parse(data)
    del data
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return size, len(orjson.dumps(conv.to_dict()))


def window_bytes(bodies: list[bytes], window: int) -> int:
    """Retained bytes of the parsed conversations of an episode's last `window` calls as `serve` holds them:
    parsed in order by the addon's ResentBodies (a call shares the Messages its bytes share with the call
    before), with the last long request body it keeps."""
    from polarproxy.dialects.openai_chat import OpenAIChat
    from polarproxy.dialects.resend import ResentBodies

    tracemalloc.start()
    resent = ResentBodies()
    convs = [resent.parse(OpenAIChat(), "e", bytes(b), path=CHAT_PATH, query={}) for b in bodies]
    del convs[:-window]
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return size


class Run:
    def __init__(self, work: Path, episodes: int, context: int, calls: int) -> None:
        self.work = work
        self.episodes = episodes
        self.context = context
        self.calls = calls
        self.procs: dict[str, Proc] = {}
        self.sent: list[dict[str, Any]] = []  # per call: episode, prompt tokens, body bytes

    def start(self) -> None:
        from polarproxy.render.renderer import Renderer
        from polarproxy.tiny import write_tokenizer_folder
        from polarproxy.tiny.formats import detect_family

        self.model_dir = write_tokenizer_folder(self.work / "qwen3-tiny", chat_template=QWEN3)
        r = Renderer(self.model_dir)
        family = detect_family(r.tokenizer.chat_template)
        out = [*r.encode(family.write("", [("run_shell_command", CALL_ARGS)], None)), r.stop_token_ids[0]]
        self.text = TextSource(r.encode)
        stub, url = spawn(
            "stub",
            [sys.executable, str(REPO / "bench" / "stub_server.py"), "--output-ids", orjson.dumps(out).decode(),
             "--first-token-ms", "0", "--per-token-ms", "0"],
            re.compile(r"listening on (http://[\d.]+:\d+)"),
            timeout=30,
        )  # fmt: skip
        self.procs["stub"] = stub
        self.db = self.work / "serve-memory.db"
        pp, pp_url = spawn(
            "polarproxy",
            [sys.executable, "-m", "polarproxy", "serve", "--backend", url, "--model", str(self.model_dir),
             "--db", str(self.db), "--port", "0"],
            re.compile(r"recording on (http://[\d.]+:\d+)"),
        )  # fmt: skip
        self.procs["polarproxy"] = pp
        self.url = pp_url + CHAT_PATH
        # one episode's tool results (tokens): the first call ~1k, then equal steps to `context`
        step = (context_left := self.context - 1_000) // max(1, self.calls - 1)
        self.results = [step - 40] * (self.calls - 1) if context_left > 0 else []
        self.query = "The test suite fails; please find the cause and fix it.\n" + self.text.take(600)

    def stop(self) -> None:
        for name in ("polarproxy", "stub"):
            if name in self.procs:
                self.procs[name].stop()

    async def episode(self, client: httpx.AsyncClient, n: int, calls: int | None = None) -> None:
        eid = f"bench-mem-{os.getpid()}-{n}" if n >= 0 else f"bench-mem-warm-{os.getpid()}"
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": self.query},
        ]
        for k in range(self.calls if calls is None else calls):
            body = orjson.dumps({"model": "tiny", "messages": messages, "tools": TOOLS, "max_tokens": 64})
            r = await client.post(
                self.url,
                content=body,
                headers={"content-type": "application/json", "x-polarproxy-episode": eid},
            )
            if r.status_code != 200:
                raise RuntimeError(f"proxy answered HTTP {r.status_code}: {r.text[:300]}")
            answer = orjson.loads(r.content)
            if n < 0:
                msg = answer["choices"][0]["message"]
                messages += [{"role": "assistant", "content": None, "tool_calls": msg["tool_calls"]},
                             {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "ok"}]  # fmt: skip
                continue
            self.sent.append({"episode": eid, "call": k, "prompt_tokens": answer["usage"]["prompt_tokens"],
                              "body_bytes": len(body), "body": body if n == 0 else None})  # fmt: skip
            msg = answer["choices"][0]["message"]
            messages.append(
                {"role": "assistant", "content": msg.get("content"), "tool_calls": msg["tool_calls"]}
            )
            if k < len(self.results):
                content = self.text.take(self.results[k])
                messages.append(
                    {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": content}
                )

    async def measure(self, checkpoints: list[int]) -> list[dict[str, Any]]:
        pid = self.procs["polarproxy"].pid
        limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
        async with httpx.AsyncClient(timeout=120, limits=limits, trust_env=False) as client:
            # warm-up (imports, tokenizer, database, connections): one small episode, not counted
            await self.episode(client, -1, calls=2)
            await asyncio.sleep(0.5)
            points = [{"episodes": 0, **mem_mb(pid), "calls": 0}]
            opened = 0
            for target in checkpoints:
                t0 = time.perf_counter()
                todo = list(range(opened, target))
                while todo:
                    batch, todo = todo[:CONCURRENCY], todo[CONCURRENCY:]
                    await asyncio.gather(*(self.episode(client, n) for n in batch))
                opened = target
                await asyncio.sleep(0.5)  # let the store writer settle
                point = {"episodes": target, **mem_mb(pid), "calls": len(self.sent)}
                log(f"bench: {target} episodes open: RSS {point['rss_mb']} MB (peak {point['hwm_mb']}), "
                    f"{time.perf_counter() - t0:.1f} s")  # fmt: skip
                points.append(point)
        return points

    def check_store(self) -> dict[str, Any]:
        from polarproxy.store.store import Store

        store = Store.open(str(self.db))
        follow_ups = extended = 0
        problems: list[str] = []
        try:
            for eid in sorted({s["episode"] for s in self.sent}):
                calls = sorted(store.list_calls(eid), key=lambda c: c.started_at)
                if len(calls) != self.calls:
                    problems.append(f"{eid}: {len(calls)} calls recorded of {self.calls}")
                for c in calls[1:]:
                    follow_ups += 1
                    if c.render_mode == "extended" and c.status == "ok":
                        extended += 1
                    else:
                        problems.append(f"{eid}: render_mode {c.render_mode}: {c.render_note}")
        finally:
            store.close()
        return {"follow_ups": follow_ups, "extended": extended, "all_follow_ups_extended": not problems,
                "problems": problems[:10]}  # fmt: skip


def per_episode_terms(sent: list[dict[str, Any]], bounds: dict[str, int]) -> dict[str, Any]:
    """The formula's two per-episode terms, from the first episode's requests (all episodes are alike)."""
    first = [s for s in sent if s["body"] is not None]
    window = bounds["index_calls_per_episode"]
    last = first[-window:]
    conversations = window_bytes([s["body"] for s in first], window)
    index = conversations + sum(4 * s["prompt_tokens"] for s in last)
    store = 0
    for s in last:
        store += 4 * s["prompt_tokens"] + s["body_bytes"] + conversation_bytes(s["body"])[1]
    return {"index_bytes": index, "conversations_bytes": conversations, "store_bytes": store, "calls": len(last),
            "context_tokens": max(s["prompt_tokens"] for s in first)}  # fmt: skip


def formula(base_mb: float, terms: dict[str, Any], bounds: dict[str, int], episodes: int) -> float:
    idx = min(episodes, bounds["index_max_episodes"]) * terms["index_bytes"]
    store = min(episodes * terms["store_bytes"], bounds["store_cache_bytes"])
    return base_mb + (idx + store) / MIB


def fit(points: list[dict[str, Any]]) -> dict[str, float]:
    xs = [p["episodes"] for p in points]
    ys = [p["rss_mb"] for p in points]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return {"base_mb": round(my - slope * mx, 1), "per_episode_mb": round(slope, 3)}


async def run(a: argparse.Namespace, work: Path) -> dict[str, Any]:
    t0 = time.perf_counter()
    load_before = [round(x, 2) for x in os.getloadavg()]
    checkpoints = sorted({max(1, a.episodes * k // 8) for k in (1, 2, 4)} | {a.episodes})
    r = Run(work, a.episodes, a.context, a.calls)
    r.start()
    try:
        points = await r.measure(checkpoints)
    finally:
        r.stop()
    store = r.check_store()
    bounds = index_bounds()
    terms = per_episode_terms(r.sent, bounds)
    base = points[0]["rss_mb"]
    for p in points:
        p["formula_mb"] = round(formula(base, terms, bounds, p["episodes"]), 1)
        p["error_pct"] = round(100 * (p["rss_mb"] - p["formula_mb"]) / p["formula_mb"], 1)
    worst = {  # every episode at its index's full window, every call at `context` tokens
        "episodes": bounds["index_max_episodes"],
        "calls_per_episode": bounds["index_calls_per_episode"],
        "context_tokens": terms["context_tokens"],
    }
    per_call = terms["index_bytes"] / max(1, terms["calls"])  # an average call of this run
    last_body = next(s["body"] for s in reversed(r.sent) if s["body"] is not None)
    last_index = 4 * terms["context_tokens"] + conversation_bytes(last_body)[0]
    # no two calls of an episode sharing a message (each branches from the history), plus the addon's bodies
    kept = min(
        worst["episodes"] * bounds["resent_bodies_per_episode"] * len(last_body), bounds["resent_max_bytes"]
    )
    worst["bound_mb"] = round(base + (worst["episodes"] * worst["calls_per_episode"] * last_index + kept
                                      + bounds["store_cache_bytes"]) / MIB, 1)  # fmt: skip
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {"cpus": os.cpu_count(), "loadavg_before": load_before,
                 "loadavg_after": [round(x, 2) for x in os.getloadavg()], "python": sys.version.split()[0]},
        "config": {"quick": a.quick, "episodes": a.episodes, "context": a.context, "calls_per_episode": a.calls,
                   "concurrency": CONCURRENCY, "template": QWEN3.name,
                   "chars_per_token": round(r.text.chars_per_token, 2)},
        "bounds": bounds,
        "per_episode": {**terms, "index_mb": round(terms["index_bytes"] / MIB, 3),
                        "store_mb": round(terms["store_bytes"] / MIB, 3),
                        "index_bytes_per_call_avg": round(per_call),
                        "index_bytes_per_call_at_context": last_index},
        "points": points,
        "fit": fit(points),
        # without the 0 point: the slope once the first step's one-time growth (allocator arenas, SQLite's
        # page cache, connection buffers) is behind, against the formula's per-episode terms
        "fit_after_first_step": fit(points[1:]),
        "formula_per_episode_mb": round(
            (terms["index_bytes"] + (terms["store_bytes"] if a.episodes * terms["store_bytes"] <= bounds["store_cache_bytes"] else 0)) / MIB, 3
        ),
        "max_abs_error_pct": max(abs(p["error_pct"]) for p in points),
        "worst_case": worst,
        "store": store,
        "elapsed_s": round(time.perf_counter() - t0, 1),
    }  # fmt: skip


def table(res: dict[str, Any]) -> str:
    c, pe = res["config"], res["per_episode"]
    w = [
        f"polarproxy serve memory, {res['date']}, {res['host']['cpus']} CPUs, load "
        f"{res['host']['loadavg_before']} -> {res['host']['loadavg_after']}",
        f"{c['episodes']} episodes x {c['calls_per_episode']} calls up to {pe['context_tokens']} tokens (Qwen3, T2)",
        f"per episode: index {pe['index_mb']} MB (prompt arrays + conversations), store cache {pe['store_mb']} MB "
        f"(packed tokens + bodies; all episodes <= {res['bounds']['store_cache_bytes'] // MIB} MiB)",
        "",
        f"{'episodes':>9}{'RSS MB':>10}{'peak MB':>10}{'formula MB':>12}{'error %':>9}",
    ]
    for p in res["points"]:
        w.append(
            f"{p['episodes']:>9}{p['rss_mb']:>10}{p['hwm_mb']:>10}{p['formula_mb']:>12}{p['error_pct']:>9}"
        )
    f = res["fit"]
    f2 = res["fit_after_first_step"]
    w.append(f"\nlinear fit: {f['base_mb']} MB + {f['per_episode_mb']} MB x episodes; without the 0 point: "
             f"{f2['base_mb']} MB + {f2['per_episode_mb']} MB x episodes (formula's per-episode term: "
             f"{res['formula_per_episode_mb']} MB)")  # fmt: skip
    wc = res["worst_case"]
    w.append(f"bound at {wc['episodes']} episodes x {wc['calls_per_episode']} calls x {wc['context_tokens']} "
             f"tokens: {wc['bound_mb']} MB")  # fmt: skip
    st = res["store"]
    w.append(f"store: {st['follow_ups']} follow-ups, {st['extended']} extended -> every follow-up extended: "
             f"{st['all_follow_ups_extended']}")  # fmt: skip
    w.append(f"elapsed {res['elapsed_s']} s")
    return "\n".join(w)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="16 episodes x 3 calls to 4k tokens (a smoke run)")
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--context", type=int, default=32_768, help="tokens of each episode's last call")
    ap.add_argument("--calls", type=int, default=3, help="calls per episode (>= 2)")
    ap.add_argument("--json", type=Path, help="write every figure here")
    a = ap.parse_args()
    if a.quick:
        a.episodes, a.context, a.calls = 16, 4_096, 3
    if a.calls < 2 or a.episodes < 1:
        ap.error(f"--calls must be >= 2 and --episodes >= 1 (got {a.calls}, {a.episodes})")
    with tempfile.TemporaryDirectory(prefix="polarproxy-mem-") as work:
        res = asyncio.run(run(a, Path(work)))
    print(table(res))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=2) + "\n")
        log(f"bench: wrote {a.json}")
    if not res["store"]["all_follow_ups_extended"]:
        log(
            "bench: FAILED: not every follow-up call extended the one before: "
            + "; ".join(res["store"]["problems"])
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
