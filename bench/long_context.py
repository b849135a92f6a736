"""What polarproxy adds per call at a 32k-token, 64-turn context against a 1k-token one (T2 on, Qwen3 template).

    python bench/long_context.py [--quick] [--json OUT] [--profile PATH] [--long-episodes N]

One stub backend (bench/stub_server.py, its own process) answers every call with the same short Qwen3 tool
call (token IDs and logprobs). `polarproxy serve --backend STUB` (its own process, SQLite store in a temp
dir, default prefix policy `extend`) sits in front of it, started through GC_WATCH (below: polarproxy's own
CLI with a gc callback); the model folder is the tiny kit's tokenizer-only folder (`write_tokenizer_folder`:
no weights, only the tokenizer matters) with the real Qwen3 chat template
(../shared/fixtures/chat-templates/qwen3.jinja).

The client plays harness episodes over OpenAI Chat Completions (non-streamed), each call sending the whole
conversation so far: the assistant turn the proxy returned (its tool call IDs) and a new tool result.

  1k case    episodes of 8 calls whose requests are ~1k tokens (a system prompt, two tools, a query, then
             short tool results); a new episode starts when one ends.
  32k case   episodes of 64 turns: the first half reads large tool results (files) up to ~30k tokens, the
             second half makes small steps (test runs, edits) up to ~32k; every call extends the one before.

Each round sends one call of each case to the proxy and the same request body straight to the stub (the
order shuffled per round), so machine noise hits all four alike. Added latency = proxy - direct (p50/p99
over the same run); proxy CPU per call from the process's threads' on-CPU time (/proc/PID/task/*/schedstat,
nanoseconds) read before and after each proxy call. The 32k figures are over the calls whose prompts have
at least `measure_from` tokens (30k); the 1k figures over every follow-up call of the 1k episodes. The
store is read afterwards: every follow-up call must have render_mode 'extended' (T2), else the bench fails.

`--profile PATH` then samples the proxy with py-spy (all threads, waits left out; raw stacks to
PATH-1k.raw.txt and PATH-32k.raw.txt) over 1k follow-up calls and over the >= `measure_from` calls of one
more 32k episode, and adds to the JSON each stage's share of the samples times the CPU per call of those
calls (ms per call at 1k and 32k, and the growth; bench/long_context_profile.py), the garbage collector's
time per call, and the per-call operations on the whole prompt or request timed alone in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from long_context_profile import operation_costs, where_time_goes
from proxy_overhead import REPO, Proc, cpu_s, log, mem_mb, ms, pct, spawn, thread_cpu_ns

QWEN3 = REPO.parent / "shared" / "fixtures" / "chat-templates" / "qwen3.jinja"
CHAT_PATH = "/v1/chat/completions"
TARGET_RATIO = 1.5
SYSTEM = (
    "You are a coding agent working in a repository. Use the tools to inspect files and run commands; "
    "make the smallest change that fixes the failing test, run the tests again, then say done. "
) * 6
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_shell_command",
            "description": "Run a shell command in the workspace and return its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command line."}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file of the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "The file's path."}},
                "required": ["path"],
            },
        },
    },
]
CALL_ARGS = {"command": "pytest tests/test_module.py -x -q"}
# `polarproxy ARGS` with a gc callback that adds up the collector's time per generation and writes the
# totals to argv[1] every 200 ms (the bench reads them around its profile windows); polarproxy unchanged.
GC_WATCH = """
import gc, json, os, sys, threading, time
path = sys.argv.pop(1)
tot = {"runs": [0, 0, 0], "seconds": [0.0, 0.0, 0.0]}
t0 = [0.0]
def cb(phase, info):
    if phase == "start":
        t0[0] = time.perf_counter()
    else:
        g = info["generation"]
        tot["runs"][g] += 1
        tot["seconds"][g] += time.perf_counter() - t0[0]
gc.callbacks.append(cb)
def dump():
    while True:
        time.sleep(0.2)
        with open(path + ".tmp", "w") as f:
            json.dump(tot, f)
        os.replace(path + ".tmp", path)
threading.Thread(target=dump, daemon=True).start()
sys.argv[0] = "polarproxy"
from polarproxy.cli import main
sys.exit(main())
"""


@dataclass(frozen=True)
class Sizes:
    """The shape of a run: how long the episodes are and how many rounds are measured."""

    long_turns: int = 64  # calls per long episode
    long_tokens: int = 32_768  # context of a long episode's last call
    measure_from: int = 30_000  # long calls with prompts this long are the 32k figure
    short_calls: int = 8  # calls per 1k episode
    short_tokens: int = 1_024
    long_episodes: int = 10
    warmup: int = 8  # 1k calls before measuring


FULL = Sizes()
QUICK = Sizes(long_turns=16, long_tokens=6_000, measure_from=5_400, short_calls=4, long_episodes=1, warmup=2)


# -- the harness's conversations ------------------------------------------------------------------


class TextSource:
    """Deterministic file-like text, sized in tokens of the model's tokenizer (chars/token calibrated once)."""

    def __init__(self, encode: Any, seed: int = 0) -> None:
        rng = random.Random(seed)
        words = ["value", "result", "index", "buffer", "config", "token", "offset", "count", "items", "path"]
        lines = []
        for i in range(6000):
            a, b = rng.sample(words, 2)
            lines.append(f"    def {a}_{i}(self, {b}: int = {rng.randint(0, 999)}) -> int:  # {b} of {a}\n")
        self.text = "".join(lines)
        sample = self.text[:40_000]
        self.chars_per_token = len(sample) / len(encode(sample))
        self.pos = 0

    def take(self, tokens: int) -> str:
        n = max(8, int(tokens * self.chars_per_token))
        if self.pos + n > len(self.text):
            self.pos = 0
        out = self.text[self.pos : self.pos + n]
        self.pos += n
        return out


@dataclass
class Episode:
    """One harness episode: its messages so far, and the prompt size (tokens) each later call should reach."""

    id: str
    case: str  # '1k' | '32k'
    targets: list[int]  # prompt tokens wanted at calls 2, 3, ... (one tool result each)
    messages: list[dict[str, Any]] = field(default_factory=list)
    calls: int = 0

    def body(self) -> bytes:
        return orjson.dumps(
            {"model": "tiny", "messages": self.messages, "tools": TOOLS, "max_tokens": 64, "stream": False}
        )

    def done(self) -> bool:
        return self.calls > len(self.targets)

    def answered(self, answer: dict[str, Any], text: TextSource) -> None:
        """Append the assistant turn the proxy returned and, if the episode goes on, a tool result sized so
        that the next prompt reaches its target (this prompt's tokens + the answer + the result)."""
        msg = answer["choices"][0]["message"]
        calls = msg.get("tool_calls") or []
        if not calls:
            raise RuntimeError(f"episode {self.id}: the answer made no tool call: {msg!r}")
        self.messages.append({"role": "assistant", "content": msg.get("content"), "tool_calls": calls})
        if self.calls <= len(self.targets):
            used = (
                answer["usage"]["prompt_tokens"] + answer["usage"]["completion_tokens"] + RESULT_WRAP_TOKENS
            )
            result = text.take(max(8, self.targets[self.calls - 1] - used))
            self.messages.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": result})


RESULT_WRAP_TOKENS = 12  # what the Qwen3 template writes around a tool result and the generation prompt


def new_episode(case: str, n: int, sizes: Sizes, text: TextSource) -> Episode:
    if case == "1k":
        # system + tools + query ~ 3/4 of the size, then short results up to ~1k at the last call
        start, calls = int(sizes.short_tokens * 0.75), sizes.short_calls
        step = (sizes.short_tokens - start) / (calls - 1)
        targets = [int(start + step * k) for k in range(1, calls)]
    else:
        # the first half reads files up to `measure_from`, the second half makes small steps to the full size
        start, turns = 1_000, sizes.long_turns
        half = turns // 2
        top = sizes.measure_from + 100
        targets = [int(start + (top - start) * k / half) for k in range(1, half + 1)]
        rest = turns - 1 - half
        targets += [int(top + (sizes.long_tokens - top) * k / rest) for k in range(1, rest + 1)]
    query = "The test suite fails; please find the cause and fix it.\n" + text.take(max(8, start - 400))
    ep = Episode(f"bench-long-{case}-{os.getpid()}-{n}", case, targets)
    ep.messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": query}]
    return ep


# -- measuring ------------------------------------------------------------------------------------


@dataclass
class Sample:
    case: str
    prompt_tokens: int
    proxy_s: float
    direct_s: float
    cpu_ns: int
    extended_expected: bool


class Bench:
    def __init__(self, sizes: Sizes, work: Path) -> None:
        self.sizes = sizes
        self.work = work
        self.procs: dict[str, Proc] = {}
        self.episodes: list[Episode] = []
        self.n = 0
        self.spy_args: list[str] = []  # e.g. ["--native"]: C frames too (gc, orjson, tokenizers)

    def start(self) -> None:
        from polarproxy.render.renderer import Renderer
        from polarproxy.tiny import write_tokenizer_folder
        from polarproxy.tiny.formats import detect_family

        self.model_dir = write_tokenizer_folder(self.work / "qwen3-tiny", chat_template=QWEN3)
        r = Renderer(self.model_dir)
        family = detect_family(r.tokenizer.chat_template)
        self.output_ids = [
            *r.encode(family.write("", [("run_shell_command", CALL_ARGS)], None)),
            r.stop_token_ids[0],
        ]
        self.text = TextSource(r.encode)
        self.encode = r.encode
        stub, url = spawn(
            "stub",
            [sys.executable, str(REPO / "bench" / "stub_server.py"), "--output-ids",
             orjson.dumps(self.output_ids).decode(), "--first-token-ms", "2", "--per-token-ms", "0"],
            re.compile(r"listening on (http://[\d.]+:\d+)"),
            timeout=30,
        )  # fmt: skip
        self.procs["stub"] = stub
        self.stub_url = url
        self.db = self.work / "long-context.db"
        self.gc_file = self.work / "gc.json"
        pp, pp_url = spawn(
            "polarproxy",
            [sys.executable, "-c", GC_WATCH, str(self.gc_file), "serve", "--backend", url, "--model", str(self.model_dir),
             "--db", str(self.db), "--port", "0"],
            re.compile(r"recording on (http://[\d.]+:\d+)"),
        )  # fmt: skip
        self.procs["polarproxy"] = pp
        self.proxy_url = pp_url

    def stop(self) -> None:
        for name in ("polarproxy", "stub"):
            if name in self.procs:
                self.procs[name].stop()

    def next_episode(self, case: str) -> Episode:
        self.n += 1
        ep = new_episode(case, self.n, self.sizes, self.text)
        self.episodes.append(ep)
        return ep

    async def proxy_call(self, client: httpx.AsyncClient, ep: Episode) -> tuple[float, int, int, dict]:
        body = ep.body()
        pid = self.procs["polarproxy"].pid
        c0 = thread_cpu_ns(pid)
        t0 = time.perf_counter()
        r = await client.post(
            self.proxy_url + CHAT_PATH,
            content=body,
            headers={"content-type": "application/json", "x-polarproxy-episode": ep.id},
        )
        dt = time.perf_counter() - t0
        c1 = thread_cpu_ns(pid)
        if r.status_code != 200:
            raise RuntimeError(f"proxy answered HTTP {r.status_code}: {r.text[:500]}")
        answer = orjson.loads(r.content)
        ep.calls += 1
        return dt, c1 - c0, answer["usage"]["prompt_tokens"], answer

    async def direct_call(self, client: httpx.AsyncClient, body: bytes) -> float:
        t0 = time.perf_counter()
        r = await client.post(
            self.stub_url + CHAT_PATH, content=body, headers={"content-type": "application/json"}
        )
        _ = r.content
        dt = time.perf_counter() - t0
        if r.status_code != 200:
            raise RuntimeError(f"stub answered HTTP {r.status_code}")
        return dt

    async def step(self, clients: dict[str, httpx.AsyncClient], case: str, ep: Episode, rng: random.Random,
                   out: list[Sample]) -> None:  # fmt: skip
        body = ep.body()
        first = ep.calls == 0
        if rng.random() < 0.5:
            direct = await self.direct_call(clients["direct"], body)
            dt, cpu, tokens, answer = await self.proxy_call(clients["proxy"], ep)
        else:
            dt, cpu, tokens, answer = await self.proxy_call(clients["proxy"], ep)
            direct = await self.direct_call(clients["direct"], body)
        ep.answered(answer, self.text)
        out.append(Sample(case, tokens, dt, direct, cpu, not first))

    async def run_phase(self) -> list[Sample]:
        s = self.sizes
        rng = random.Random(0)
        limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)
        clients = {
            k: httpx.AsyncClient(timeout=120, limits=limits, trust_env=False) for k in ("proxy", "direct")
        }
        samples: list[Sample] = []
        try:
            short = self.next_episode("1k")
            warm: list[Sample] = []
            for _ in range(s.warmup):
                if short.done():
                    short = self.next_episode("1k")
                await self.step(clients, "1k", short, rng, warm)
            short = self.next_episode("1k")
            gc.collect()
            gc.disable()
            for k in range(s.long_episodes):
                long = self.next_episode("32k")
                log(
                    f"bench: 32k episode {k + 1}/{s.long_episodes} ({s.long_turns} calls, interleaved with 1k calls)"
                )
                while not long.done():
                    pair: list[tuple[str, Episode]] = [("32k", long), ("1k", short)]
                    rng.shuffle(pair)
                    for case, ep in pair:
                        await self.step(clients, case, ep, rng, samples)
                    if short.done():
                        short = self.next_episode("1k")
                gc.collect()
        finally:
            gc.enable()
            for c in clients.values():
                await c.aclose()
        return samples

    def gc_totals(self) -> dict[str, list[float]]:
        """The proxy's garbage-collector totals so far (written by GC_WATCH every 200 ms)."""
        return json.loads(self.gc_file.read_text())

    async def profile_phase(self, out: Path) -> dict[str, Any]:
        """py-spy samples the proxy (all threads) over 1k follow-up calls, then over the >= measure_from
        calls of one more 32k episode; each stage's share of the busy samples times the CPU per call of
        those calls gives its milliseconds per call, at 1k and at 32k."""
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(spy).exists():
            return {"error": "py-spy is not installed (.venv/bin/pip install py-spy)"}
        rng = random.Random(1)
        clients = {k: httpx.AsyncClient(timeout=120, trust_env=False) for k in ("proxy", "direct")}
        pid = self.procs["polarproxy"].pid
        cases: dict[str, Any] = {}
        try:
            want = max(
                16, self.sizes.long_turns // 2
            )  # about as many calls as a 32k episode has >= measure_from
            for case in ("1k", "32k"):
                out.parent.mkdir(parents=True, exist_ok=True)
                raw = out.with_name(f"{out.stem}-{case}.raw.txt")
                ep = self.next_episode(case)
                samples: list[Sample] = []
                proc: subprocess.Popen[bytes] | None = None
                measured: list[Sample] = []
                while case == "32k" or len(measured) < want:
                    if ep.done():
                        if case == "32k":
                            break
                        ep = self.next_episode(case)
                    ready = case == "1k" or (samples and samples[-1].prompt_tokens >= self.sizes.measure_from)
                    if proc is None and ready:
                        proc = subprocess.Popen(
                            [spy, "record", "--pid", str(pid), "--rate", "1000", "--format", "raw",
                             "--output", str(raw), *(self.spy_args or ["--nonblocking"])],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                        )  # fmt: skip
                        await asyncio.sleep(1.5)  # py-spy attaches
                        gc0 = (
                            self.gc_totals()
                        )  # a dump at most 200 ms old: the window's edges are approximate
                    await self.step(clients, case, ep, rng, samples)
                    if proc is not None and samples[-1].extended_expected:
                        measured.append(samples[-1])
                if proc is None:
                    return {"error": f"py-spy never started for the {case} case"}
                await asyncio.sleep(0.3)
                gc1 = self.gc_totals()
                proc.send_signal(signal.SIGINT)
                _, err = proc.communicate(timeout=60)
                if not raw.exists():
                    return {"error": "py-spy wrote nothing: " + err.decode()[-500:]}
                # the first call after py-spy attached can include its start; the CPU is of the calls sampled
                cpu_ms = statistics.fmean(x.cpu_ns for x in measured) / 1e6
                gc_ms = [
                    1000 * (b - a) / len(measured)
                    for a, b in zip(gc0["seconds"], gc1["seconds"], strict=True)
                ]
                cases[case] = {
                    "raw": str(raw),
                    "calls": len(measured),
                    "cpu_ms_per_call": round(cpu_ms, 3),
                    "gc_ms_per_call": round(sum(gc_ms), 3),
                    "gc_ms_per_call_by_generation": [round(x, 3) for x in gc_ms],
                    "gc_runs_by_generation": [b - a for a, b in zip(gc0["runs"], gc1["runs"], strict=True)],
                    **where_time_goes(raw.read_text(), cpu_ms),
                }
        finally:
            for c in clients.values():
                await c.aclose()
        ms1, ms32 = cases["1k"]["stage_ms_per_call"], cases["32k"]["stage_ms_per_call"]
        growth = {k: round(ms32.get(k, 0.0) - ms1.get(k, 0.0), 3) for k in {*ms1, *ms32}}
        extra = sum(v for v in growth.values() if v > 0)  # shares of what grew
        return {
            **cases,
            "growth_ms_per_call": dict(sorted(growth.items(), key=lambda kv: -kv[1])),
            "growth_share": {k: round(v / extra, 3) for k, v in sorted(growth.items(), key=lambda kv: -kv[1])}
            if extra > 0
            else {},
        }

    def check_store(self) -> dict[str, Any]:
        from polarproxy.store.store import Store

        store = Store.open(str(self.db))
        bad: list[str] = []
        counted = {"calls": 0, "first_calls": 0, "follow_ups": 0, "extended": 0}
        try:
            for ep in (e for e in self.episodes if e.calls):
                calls = sorted(store.list_calls(ep.id), key=lambda c: c.started_at)
                if len(calls) != ep.calls:
                    bad.append(f"{ep.id}: {len(calls)} calls recorded of {ep.calls} sent")
                for i, c in enumerate(calls):
                    counted["calls"] += 1
                    if i == 0:
                        counted["first_calls"] += 1
                        continue
                    counted["follow_ups"] += 1
                    if c.render_mode == "extended" and c.status == "ok":
                        counted["extended"] += 1
                    else:
                        bad.append(
                            f"{ep.id} call {i}: render_mode {c.render_mode}, status {c.status}: {c.render_note}"
                        )
        finally:
            store.close()
        return {**counted, "all_follow_ups_extended": not bad, "problems": bad[:10]}


# -- figures --------------------------------------------------------------------------------------


def figures(samples: list[Sample], sizes: Sizes) -> dict[str, Any]:
    groups = {
        "1k": [x for x in samples if x.case == "1k" and x.extended_expected],
        "32k": [x for x in samples if x.case == "32k" and x.prompt_tokens >= sizes.measure_from],
    }
    out: dict[str, Any] = {}
    for case, g in groups.items():
        if not g:
            raise RuntimeError(f"no {case} calls were measured")
        added = [x.proxy_s - x.direct_s for x in g]
        proxy = [x.proxy_s for x in g]
        direct = [x.direct_s for x in g]
        out[case] = {
            "calls": len(g),
            "prompt_tokens_min": min(x.prompt_tokens for x in g),
            "prompt_tokens_max": max(x.prompt_tokens for x in g),
            "proxy_p50_ms": ms(pct(proxy, 50)),
            "proxy_p99_ms": ms(pct(proxy, 99)),
            "direct_p50_ms": ms(pct(direct, 50)),
            "direct_p99_ms": ms(pct(direct, 99)),
            "added_p50_ms": ms(pct(proxy, 50) - pct(direct, 50)),
            "added_p99_ms": ms(pct(proxy, 99) - pct(direct, 99)),
            "paired_added_p50_ms": ms(pct(added, 50)),
            "cpu_ms_per_call": round(statistics.fmean(x.cpu_ns for x in g) / 1e6, 3),
        }
    # how the added latency and CPU grow with the prompt (all long-episode calls, by prompt size)
    buckets: dict[str, Any] = {}
    edges = [
        *sorted({e for e in (0, 2_000, 8_000, 16_000) if e < sizes.measure_from}),
        sizes.measure_from,
        1 << 30,
    ]
    for lo, hi in itertools.pairwise(edges):
        g = [x for x in samples if x.case == "32k" and x.extended_expected and lo <= x.prompt_tokens < hi]
        if g:
            buckets[f"{lo}-{hi if hi < 1 << 30 else 'max'}"] = {
                "calls": len(g),
                "paired_added_p50_ms": ms(pct([x.proxy_s - x.direct_s for x in g], 50)),
                "cpu_ms_per_call": round(statistics.fmean(x.cpu_ns for x in g) / 1e6, 3),
            }
    out["long_episode_by_prompt_tokens"] = buckets
    ratios = {
        "added_p50": round(out["32k"]["added_p50_ms"] / out["1k"]["added_p50_ms"], 2),
        "added_p99": round(out["32k"]["added_p99_ms"] / out["1k"]["added_p99_ms"], 2),
        "cpu_per_call": round(out["32k"]["cpu_ms_per_call"] / out["1k"]["cpu_ms_per_call"], 2),
    }
    out["ratio_32k_over_1k"] = ratios
    out["target"] = f"<= {TARGET_RATIO:g}x"
    out["met"] = {k: v <= TARGET_RATIO for k, v in ratios.items()}
    return out


def table(r: dict[str, Any]) -> str:
    f = r["figures"]
    w = [
        f"polarproxy long-context benchmark, {r['date']}, {r['host']['cpus']} CPUs, load "
        f"{r['host']['loadavg_before']} -> {r['host']['loadavg_after']}",
        f"Qwen3 template, T2 on; stub answers {r['config']['output_tokens']} tokens; non-streamed",
        "",
        f"{'':32}{'1k':>12}{'32k':>12}{'32k/1k':>10}",
    ]
    for key, label, ratio in (
        ("prompt_tokens_max", "prompt tokens (max)", None),
        ("calls", "calls measured", None),
        ("direct_p50_ms", "direct p50 ms", None),
        ("proxy_p50_ms", "proxy p50 ms", None),
        ("added_p50_ms", "added p50 ms", "added_p50"),
        ("added_p99_ms", "added p99 ms", "added_p99"),
        ("paired_added_p50_ms", "paired added p50 ms", None),
        ("cpu_ms_per_call", "proxy CPU ms/call", "cpu_per_call"),
    ):
        rr = f"{f['ratio_32k_over_1k'][ratio]:>9.2f}x" if ratio else ""
        w.append(f"{label:32}{f['1k'][key]:>12}{f['32k'][key]:>12}{rr}")
    w.append("")
    w.append("long episode by prompt size: paired added p50 ms / CPU ms per call")
    for k, v in f["long_episode_by_prompt_tokens"].items():
        w.append(
            f"  {k:>16} tokens  {v['calls']:>4} calls  {v['paired_added_p50_ms']:>8.2f}  {v['cpu_ms_per_call']:>8.2f}"
        )
    w.append("")
    for k, met in f["met"].items():
        w.append(
            f"  {k:14} {f['ratio_32k_over_1k'][k]:>6.2f}x  target {f['target']}  {'met' if met else 'MISSED'}"
        )
    px = r["proxy"]
    w.append(
        f"\ngarbage collector over the measured phase: {sum(px['gc_s_by_generation']):.2f} s of "
        f"{px['cpu_s_total_schedstat']:.2f} s proxy CPU (runs by generation {px['gc_runs_by_generation']}, "
        f"seconds {px['gc_s_by_generation']})"
    )
    st = r["store"]
    w.append(
        f"\nstore: {st['calls']} calls, {st['follow_ups']} follow-ups, {st['extended']} extended -> "
        f"every follow-up extended: {st['all_follow_ups_extended']}"
    )
    prof = r.get("profile")
    if prof and "growth_ms_per_call" in prof:
        p1, p32 = prof["1k"], prof["32k"]
        w.append(
            f"\nwhere the proxy's CPU goes (py-spy, all threads; {p1['busy_samples']} busy samples over "
            f"{p1['calls']} 1k calls, {p32['busy_samples']} over {p32['calls']} calls >= "
            f"{r['config']['measure_from']} tokens), ms per call:"
        )
        w.append(f"  {'stage':52}{'1k':>8}{'32k':>8}{'growth':>8}{'share':>7}")
        for k, g in prof["growth_ms_per_call"].items():
            share = prof["growth_share"].get(k, 0.0)
            w.append(
                f"  {k:52}{p1['stage_ms_per_call'].get(k, 0.0):>8.2f}{p32['stage_ms_per_call'].get(k, 0.0):>8.2f}"
                f"{g:>+8.2f}{share * 100:>6.0f}%"
            )
        w.append(
            f"  {'(CPU per call while sampled)':52}{p1['cpu_ms_per_call']:>8.2f}{p32['cpu_ms_per_call']:>8.2f}"
        )
        w.append(
            f"  {'  of which the garbage collector (gc callbacks)':52}{p1['gc_ms_per_call']:>8.2f}"
            f"{p32['gc_ms_per_call']:>8.2f}  (runs by generation {p1['gc_runs_by_generation']} / "
            f"{p32['gc_runs_by_generation']})"
        )
    elif prof:
        w.append(f"\nprofile: {prof.get('error')}")
    ops = (prof or {}).get("operations")
    if ops:
        w.append(
            f"\nper-call operations on the whole prompt or request, timed alone (best of 15), ms at "
            f"{ops['1k']['prompt_tokens']} / {ops['32k']['prompt_tokens']} tokens "
            f"({ops['1k']['request_body_kb']} / {ops['32k']['request_body_kb']} KB request):"
        )
        for k, g in ops["growth_ms"].items():
            w.append(f"  {k:52}{ops['1k']['ms'][k]:>8.3f}{ops['32k']['ms'][k]:>8.3f}{g:>+8.3f}")
        w.append(f"  {'total growth':52}{'':16}{ops['growth_ms_total']:>+8.3f}")
    w.append(f"\nelapsed {r['elapsed_s']} s")
    return "\n".join(w)


async def run(
    sizes: Sizes, work: Path, profile: Path | None, quick: bool, spy_args: list[str]
) -> dict[str, Any]:
    t_start = time.perf_counter()
    load_before = [round(x, 2) for x in os.getloadavg()]
    bench = Bench(sizes, work)
    bench.spy_args = spy_args
    bench.start()
    try:
        cpu0 = cpu_s(bench.procs["polarproxy"].pid)
        await asyncio.sleep(0.3)
        gc0 = bench.gc_totals()
        samples = await bench.run_phase()
        cpu_total = cpu_s(bench.procs["polarproxy"].pid) - cpu0
        await asyncio.sleep(0.3)
        gc1 = bench.gc_totals()
        mem = mem_mb(bench.procs["polarproxy"].pid)
        prof = await bench.profile_phase(profile) if profile else None
    finally:
        bench.stop()
    store = bench.check_store()
    if prof is not None:
        prof["operations"] = operation_costs(bench.model_dir, bench.episodes, TOOLS, bench.output_ids)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
            "python": sys.version.split()[0],
        },
        "config": {
            "quick": quick,
            "template": QWEN3.name,
            "output_tokens": len(bench.output_ids),
            "chars_per_token": round(bench.text.chars_per_token, 2),
            **{k: getattr(sizes, k) for k in sizes.__dataclass_fields__},
        },
        "figures": figures(samples, sizes),
        "proxy": {
            "calls": len(samples),
            "cpu_s_total_utime_stime": round(cpu_total, 2),
            "cpu_s_total_schedstat": round(sum(x.cpu_ns for x in samples) / 1e9, 2),
            # the garbage collector over the measured phase (both cases; GC_WATCH's callback)
            "gc_s_by_generation": [
                round(b - a, 3) for a, b in zip(gc0["seconds"], gc1["seconds"], strict=True)
            ],
            "gc_runs_by_generation": [b - a for a, b in zip(gc0["runs"], gc1["runs"], strict=True)],
            **mem,
        },
        "store": store,
    }
    if prof is not None:
        result["profile"] = prof
    result["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="short episodes (16 turns to ~6k tokens): a smoke run"
    )
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument(
        "--profile",
        type=Path,
        help="profile with py-spy: raw stacks go to OUT-1k.raw.txt and OUT-32k.raw.txt, the figures to --json",
    )
    ap.add_argument(
        "--native",
        action="store_true",
        help="py-spy --native (pauses the proxy at each sample): C frames too (gc, orjson)",
    )
    ap.add_argument("--long-episodes", type=int, help="32k episodes to measure (default 10)")
    a = ap.parse_args()
    sizes = QUICK if a.quick else FULL
    if a.long_episodes:
        sizes = Sizes(**{**sizes.__dict__, "long_episodes": a.long_episodes})
    with tempfile.TemporaryDirectory(prefix="polarproxy-long-") as work:
        result = asyncio.run(
            run(
                sizes,
                Path(work),
                a.profile.resolve() if a.profile else None,
                a.quick,
                ["--native"] if a.native else [],
            )
        )
    print(table(result))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=2) + "\n")
        log(f"bench: wrote {a.json}")
    if not result["store"]["all_follow_ups_extended"]:
        log(
            "bench: FAILED: not every follow-up call extended the one before (T2): "
            + "; ".join(result["store"]["problems"])
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
