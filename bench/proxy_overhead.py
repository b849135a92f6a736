"""What polarproxy adds over a direct call and over a bare mitmproxy, against one fixed-time backend double.

    python bench/proxy_overhead.py [--quick] [--json OUT] [--profile OUT.prof]

One stub backend (bench/stub_server.py, its own process) answers with a fixed list of token IDs after a
fixed delay. Three targets sit side by side in front of that same stub, each its own process:

  direct      the stub's own POST /v1/chat/completions
  mitmproxy   `mitmdump --mode reverse:STUB` with a 3-line addon that streams text/event-stream
  polarproxy  `polarproxy serve --backend STUB` (renders, calls /generate, answers in OpenAI format, records)

Latency phases interleave the targets request by request (the order shuffled each round), so machine noise
hits all three alike; figures are reported as added milliseconds over the same run's direct numbers. The
throughput phase runs fixed batches at concurrency 32, the targets again taking turns batch by batch, then
reads polarproxy's database to check that every call sent was recorded with status ok. Proxy CPU per call
comes from /proc/PID/stat (utime+stime), memory from /proc/PID/status (VmRSS, VmHWM).
Clients: httpx (one AsyncClient per target, keep-alive) for the latency phases; a minimal raw-asyncio
HTTP/1.1 keep-alive client for throughput, so that the client's own CPU does not cap the figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import queue
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

REPO = Path(__file__).resolve().parent.parent
TINY_DIR = REPO / ".cache" / "bench-tiny"
TEXT = "Hello there, this is a fixed answer from the stub."
MODEL = "tiny"
FIRST_TOKEN_MS = 20.0
PER_TOKEN_MS = 1.0
CONCURRENCY = 32
TARGETS: tuple[str, ...] = ("direct", "mitmproxy", "polarproxy")
PROXIES: tuple[str, ...] = ("mitmproxy", "polarproxy")
LITELLM = "litellm"  # a fourth target with --litellm BIN: LiteLLM's proxy, the peer users would pick
CHAT_PATH = "/v1/chat/completions"
# polarproxy's goals, each against bare mitmproxy in the same run (ratios: these machines are
# noisy), and a memory goal. (name, limit, "max" or "min")
GOALS = {
    "added_p50_ratio": (1.3, "max"),  # added latency p50, non-streamed
    "added_ttfc_ratio": (1.5, "max"),  # added time to first content, streamed
    "rps_ratio": (0.8, "min"),  # recorded calls/s at concurrency 32 (and nothing lost)
    "cpu_ratio": (1.3, "max"),  # proxy CPU per call, throughput phase
    "rss_mb": (400.0, "max"),
}

MITM_ADDON = '''\
"""Bare-mitmproxy baseline: pass server-sent events through as they arrive (else mitmproxy buffers them)."""


def responseheaders(flow):
    if flow.response is not None and "text/event-stream" in flow.response.headers.get("content-type", ""):
        flow.response.stream = True
'''

SUB_ENV = {
    **os.environ,
    "PYTHONUNBUFFERED": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "NO_PROXY": "*",
    "no_proxy": "*",
}
for _k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
    SUB_ENV.pop(_k, None)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- processes ------------------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[str]
    tail: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def stop(self, sig: int = signal.SIGINT, wait: float = 10.0) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.popen.send_signal(sig)
        try:
            self.popen.wait(wait)
        except subprocess.TimeoutExpired:
            log(f"bench: {self.name} did not stop on signal {sig}; killing it")
            self.popen.kill()
            self.popen.wait(10)


def spawn(
    name: str,
    argv: list[str],
    ready: re.Pattern[str] | None,
    timeout: float = 90.0,
    env: dict[str, str] | None = None,
) -> tuple[Proc, str]:
    """Start `argv`; wait for a stderr line matching `ready` (group 1 returned). Keeps draining stderr."""
    popen = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env or SUB_ENV,
        cwd=REPO,
    )
    proc = Proc(name, popen)
    lines: queue.Queue[str | None] = queue.Queue()

    def drain() -> None:
        assert popen.stderr is not None
        for line in popen.stderr:
            proc.tail.append(line)
            del proc.tail[:-40]
            lines.put(line)
        lines.put(None)

    threading.Thread(target=drain, daemon=True).start()
    if ready is None:
        return proc, ""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            continue
        if line is None:
            break
        m = ready.search(line)
        if m:
            return proc, m.group(1)
    proc.stop(signal.SIGKILL)
    raise RuntimeError(f"{name} did not start:\n" + "".join(proc.tail))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_bare_mitmproxy(work: Path, backend_url: str) -> tuple[Proc, int]:
    """`mitmdump --mode reverse:BACKEND` on a free loopback port with MITM_ADDON (server-sent events pass
    through as they arrive); returns at once (`wait_listening` before the first call) with its port."""
    addon = work / "stream_sse.py"
    addon.write_text(MITM_ADDON)
    port = free_port()
    mitmdump = Path(sys.executable).parent / "mitmdump"
    argv = [str(mitmdump if mitmdump.exists() else shutil.which("mitmdump") or "mitmdump")]
    argv += ["--mode", f"reverse:{backend_url}", "-p", str(port), "--listen-host", "127.0.0.1"]
    mitm, _ = spawn("mitmproxy", [*argv, "-q", "-s", str(addon)], None)
    return mitm, port


def wait_listening(proc: Proc, port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}):\n" + "".join(proc.tail))
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name} is not listening on {port}:\n" + "".join(proc.tail))


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """utime + stime of process `pid` (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def thread_cpu_ns(pid: int) -> int:
    """On-CPU nanoseconds of the live threads of `pid` (schedstat). Finer than `cpu_s`'s clock ticks (10 ms
    here), so it can time one call; it leaves out threads that have ended, so `cpu_s` suits whole phases."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
            total += int(f.read().split()[0])
    return total


def mem_mb(pid: int) -> dict[str, float]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return {"rss_mb": round(out.get("VmRSS", 0.0), 1), "hwm_mb": round(out.get("VmHWM", 0.0), 1)}


def tiny_model() -> Path:
    """The random-weight tiny model (only its tokenizer matters here), built once under .cache/bench-tiny."""
    if (TINY_DIR / "tokenizer.json").is_file() and (TINY_DIR / "config.json").is_file():
        return TINY_DIR
    TINY_DIR.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=TINY_DIR.parent, prefix=".bench-tiny-"))
    log("bench: building the tiny model (random weights, ~10 s) ...")
    subprocess.run(
        [sys.executable, "-m", "polarproxy", "tiny-model", str(tmp / "m"), "--train-steps", "0"],
        check=True,
        env=SUB_ENV,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with contextlib.suppress(OSError):
        os.rename(tmp / "m", TINY_DIR)  # another run may have got there first
    shutil.rmtree(tmp, ignore_errors=True)
    return TINY_DIR


# -- statistics -----------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    """Percentile q (0-100) by linear interpolation between order statistics."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def ms(x: float) -> float:
    return round(x * 1000, 3)


# -- clients --------------------------------------------------------------------------------------


def chat_body(stream: bool) -> bytes:
    return orjson.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Say the fixed answer."}],
            "max_tokens": 64,
            "stream": stream,
        }
    )


async def call_plain(client: httpx.AsyncClient, url: str, body: bytes) -> tuple[float, bool]:
    t0 = time.perf_counter()
    r = await client.post(url, content=body, headers={"content-type": "application/json"})
    data = r.content
    dt = time.perf_counter() - t0
    ok = r.status_code == 200 and bool(orjson.loads(data)["choices"][0]["message"]["content"])
    return dt, ok


@dataclass
class StreamSample:
    ttfb: float  # response head received
    ttfc: float  # first SSE event with non-empty delta.content
    total: float
    reads: int  # body pieces as they reached the client (1 = the stream arrived in one piece)
    events: int  # SSE data events
    spread: float  # first to last content event
    text: str
    ok: bool


async def call_stream(client: httpx.AsyncClient, url: str, body: bytes) -> StreamSample:
    t0 = time.perf_counter()
    ttfc = last = None
    reads = events = 0
    buf = b""
    parts: list[str] = []
    async with client.stream("POST", url, content=body, headers={"content-type": "application/json"}) as r:
        ttfb = time.perf_counter() - t0
        status = r.status_code
        async for raw in r.aiter_raw():
            reads += 1
            buf += raw
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        continue
                    events += 1
                    choices = orjson.loads(payload).get("choices") or [{}]
                    content = (choices[0].get("delta") or {}).get("content")
                    if content:
                        now = time.perf_counter() - t0
                        if ttfc is None:
                            ttfc = now
                        last = now
                        parts.append(content)
    total = time.perf_counter() - t0
    ok = status == 200 and ttfc is not None
    ttfc = total if ttfc is None else ttfc
    return StreamSample(ttfb, ttfc, total, reads, events, (last or ttfc) - ttfc, "".join(parts), ok)


class RawConn:
    """A minimal HTTP/1.1 keep-alive client connection (content-length and chunked bodies)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.r: asyncio.StreamReader | None = None
        self.w: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.r, self.w = await asyncio.open_connection("127.0.0.1", self.port)

    def close(self) -> None:
        if self.w is not None:
            self.w.close()
        self.r = self.w = None

    async def aclose(self) -> None:
        w = self.w
        self.close()
        if w is not None:
            with contextlib.suppress(OSError):
                await w.wait_closed()

    async def request(self, data: bytes) -> tuple[int, bytes]:
        if self.w is None:
            await self.open()
        assert self.r is not None and self.w is not None
        self.w.write(data)
        head = await self.r.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length, chunked, close = None, False, False
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            k = k.strip().lower()
            if k == b"content-length":
                length = int(v)
            elif k == b"transfer-encoding" and b"chunked" in v.lower():
                chunked = True
            elif k == b"connection" and b"close" in v.lower():
                close = True
        if chunked:
            pieces = []
            while True:
                size = int((await self.r.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
                if size == 0:
                    await self.r.readuntil(b"\r\n")
                    break
                pieces.append((await self.r.readexactly(size + 2))[:-2])
            body = b"".join(pieces)
        elif length is not None:
            body = await self.r.readexactly(length)
        else:
            body = await self.r.read()
            close = True
        if close:
            self.close()
        return status, body


def raw_request(port: int, body: bytes, extra: dict[str, str]) -> bytes:
    headers = {
        "host": f"127.0.0.1:{port}",
        "content-type": "application/json",
        "content-length": str(len(body)),
        **extra,
    }
    head = f"POST {CHAT_PATH} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return head.encode() + body


async def burst(port: int, n: int, data: bytes) -> tuple[float, int]:
    """`n` requests over CONCURRENCY keep-alive connections; returns (seconds, errors)."""
    conns = [RawConn(port) for _ in range(CONCURRENCY)]
    await asyncio.gather(*(c.open() for c in conns))
    left = [n]
    errors = [0]

    async def worker(conn: RawConn) -> None:
        while left[0] > 0:
            left[0] -= 1
            try:
                status, body = await conn.request(data)
                ok = status == 200 and orjson.loads(body)["choices"][0]["message"]["content"] == TEXT
            except (OSError, asyncio.IncompleteReadError, ValueError, KeyError, IndexError):
                conn.close()
                ok = False
            if not ok:
                errors[0] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    dt = time.perf_counter() - t0
    await asyncio.gather(*(c.aclose() for c in conns))  # really closed before anything blocks the loop
    return dt, errors[0]


# -- the benchmark --------------------------------------------------------------------------------


@dataclass
class Counts:
    warmup: int
    plain_rounds: int
    stream_rounds: int
    throughput: int
    throughput_batches: int


FULL = Counts(warmup=20, plain_rounds=300, stream_rounds=300, throughput=1000, throughput_batches=4)
QUICK = Counts(warmup=5, plain_rounds=25, stream_rounds=25, throughput=160, throughput_batches=2)


class Bench:
    def __init__(self, counts: Counts, work: Path, profile: Path | None, litellm: Path | None = None) -> None:
        self.counts = counts
        self.litellm = litellm
        self.work = work
        self.profile = profile
        self.procs: dict[str, Proc] = {}
        self.urls: dict[str, str] = {}
        self.sent_to_polarproxy = 0
        self.cpu: dict[str, dict[str, float]] = {p: {} for p in PROXIES}
        self.episode = f"bench-throughput-{os.getpid()}-{int(time.time())}"
        self.shutdown_s: dict[str, float] = {}

    # setup / teardown

    def start(self, output_ids: list[int]) -> None:
        stub, url = spawn(
            "stub",
            [
                sys.executable,
                str(REPO / "bench" / "stub_server.py"),
                "--output-ids",
                orjson.dumps(output_ids).decode(),
                "--text",
                TEXT,
                "--first-token-ms",
                str(FIRST_TOKEN_MS),
                "--per-token-ms",
                str(PER_TOKEN_MS),
            ],
            re.compile(r"listening on (http://[\d.]+:\d+)"),
            timeout=30,
        )
        self.procs["stub"] = stub
        self.stub_url = url
        self.urls["direct"] = url

        mitm, port = spawn_bare_mitmproxy(self.work, url)
        self.procs["mitmproxy"] = mitm
        self.urls["mitmproxy"] = f"http://127.0.0.1:{port}"

        argv = [sys.executable]
        if self.profile is not None:
            argv += ["-m", "cProfile", "-o", str(self.profile)]
        argv += [
            "-m",
            "polarproxy",
            "serve",
            "--backend",
            url,
            "--model",
            str(self.model_dir),
            "--db",
            str(self.db),
            "--port",
            "0",
        ]
        pp, pp_url = spawn("polarproxy", argv, re.compile(r"recording on (http://[\d.]+:\d+)"))
        self.procs["polarproxy"] = pp
        self.urls["polarproxy"] = pp_url
        wait_listening(mitm, port)
        if self.litellm is not None:
            self.start_litellm(url)

    def start_litellm(self, stub_url: str) -> None:
        """LiteLLM's proxy (one uvicorn worker) routing model "tiny" to the stub's OpenAI route, with its
        telemetry and remote cost-map fetch off (nothing may leave loopback) and no master key (local)."""
        cfg = self.work / "litellm.yaml"
        cfg.write_text(
            "model_list:\n  - model_name: tiny\n    litellm_params:\n      model: openai/tiny\n"
            f"      api_base: {stub_url}/v1\n      api_key: none\nlitellm_settings:\n  telemetry: false\n"
        )
        port = free_port()
        env = {
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_TELEMETRY": "False",
            "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
        }
        proc, _ = spawn(
            LITELLM,
            [str(self.litellm), "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port)],
            re.compile(r"(Uvicorn running on)"),
            timeout=180,
            env={**SUB_ENV, **env},
        )
        self.procs[LITELLM] = proc
        self.urls[LITELLM] = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        for name in (LITELLM, "polarproxy", "mitmproxy", "stub"):
            if name in self.procs and self.procs[name].popen.poll() is None:
                t0 = time.perf_counter()
                self.procs[name].stop()
                self.shutdown_s[name] = round(time.perf_counter() - t0, 2)

    def set_timing(self, first_ms: float, per_ms: float) -> None:
        r = httpx.post(
            self.stub_url + "/_bench/timing",
            json={"first_token_ms": first_ms, "per_token_ms": per_ms},
            timeout=10,
            trust_env=False,
        )
        r.raise_for_status()

    def cpu_snapshot(self) -> dict[str, float]:
        return {p: cpu_s(self.procs[p].pid) for p in PROXIES}

    def add_cpu(self, phase: str, before: dict[str, float], calls: dict[str, int]) -> None:
        after = self.cpu_snapshot()
        for p in PROXIES:
            if calls.get(p):
                self.cpu[p][phase] = round((after[p] - before[p]) * 1000 / calls[p], 3)

    # phases

    async def latency_phases(self) -> dict[str, Any]:
        c = self.counts
        rng = random.Random(0)
        limits = httpx.Limits(max_connections=4, max_keepalive_connections=4)
        clients = {t: httpx.AsyncClient(timeout=30, limits=limits, trust_env=False) for t in TARGETS}
        urls = {t: self.urls[t] + CHAT_PATH for t in TARGETS}
        plain, streamed = chat_body(False), chat_body(True)
        try:
            for t in TARGETS:  # warm up connections, caches, tokenizer
                for _ in range(c.warmup):
                    await call_plain(clients[t], urls[t], plain)
                    await call_stream(clients[t], urls[t], streamed)
            self.sent_to_polarproxy += 2 * c.warmup

            lat: dict[str, list[float]] = {t: [] for t in TARGETS}
            errors = dict.fromkeys(TARGETS, 0)
            gc.collect()
            gc.disable()
            before = self.cpu_snapshot()
            for _ in range(c.plain_rounds):
                order = list(TARGETS)
                rng.shuffle(order)
                for t in order:
                    dt, ok = await call_plain(clients[t], urls[t], plain)
                    lat[t].append(dt)
                    errors[t] += not ok
            self.add_cpu("nonstream", before, dict.fromkeys(PROXIES, c.plain_rounds))
            self.sent_to_polarproxy += c.plain_rounds
            gc.enable()

            samples: dict[str, list[StreamSample]] = {t: [] for t in TARGETS}
            gc.collect()
            gc.disable()
            before = self.cpu_snapshot()
            for _ in range(c.stream_rounds):
                order = list(TARGETS)
                rng.shuffle(order)
                for t in order:
                    samples[t].append(await call_stream(clients[t], urls[t], streamed))
            self.add_cpu("stream", before, dict.fromkeys(PROXIES, c.stream_rounds))
            self.sent_to_polarproxy += c.stream_rounds
            gc.enable()
        finally:
            gc.enable()
            for cl in clients.values():
                await cl.aclose()

        nonstream: dict[str, Any] = {"rounds": c.plain_rounds}
        for t in TARGETS:
            v = lat[t]
            nonstream[t] = {
                "n": len(v),
                "errors": errors[t],
                "p50_ms": ms(pct(v, 50)),
                "p90_ms": ms(pct(v, 90)),
                "p99_ms": ms(pct(v, 99)),
                "mean_ms": ms(statistics.fmean(v)),
                "max_ms": ms(max(v)),
            }
        nonstream["added"] = {
            p: {
                "p50_ms": ms(pct(lat[p], 50) - pct(lat["direct"], 50)),
                "p99_ms": ms(pct(lat[p], 99) - pct(lat["direct"], 99)),
                # per-round paired difference (the three calls of a round ran back to back)
                "paired_p50_ms": ms(pct([a - b for a, b in zip(lat[p], lat["direct"], strict=True)], 50)),
            }
            for p in PROXIES
        }

        stream: dict[str, Any] = {"rounds": c.stream_rounds}
        for t in TARGETS:
            s = samples[t]
            ttfc = [x.ttfc for x in s]
            stream[t] = {
                "n": len(s),
                "errors": sum(not x.ok for x in s),
                "ttfc_p50_ms": ms(pct(ttfc, 50)),
                "ttfc_p99_ms": ms(pct(ttfc, 99)),
                "ttfb_p50_ms": ms(pct([x.ttfb for x in s], 50)),
                "total_p50_ms": ms(pct([x.total for x in s], 50)),
                "first_to_last_content_p50_ms": ms(pct([x.spread for x in s], 50)),
                "reads_min": min(x.reads for x in s),
                "reads_median": statistics.median(x.reads for x in s),
                "events_median": statistics.median(x.events for x in s),
                "text_sample": s[-1].text[:80],
            }
        stream["added"] = {
            p: {
                "ttfc_p50_ms": ms(
                    pct([x.ttfc for x in samples[p]], 50) - pct([x.ttfc for x in samples["direct"]], 50)
                ),
                "ttfc_p99_ms": ms(
                    pct([x.ttfc for x in samples[p]], 99) - pct([x.ttfc for x in samples["direct"]], 99)
                ),
                "total_p50_ms": ms(
                    pct([x.total for x in samples[p]], 50) - pct([x.total for x in samples["direct"]], 50)
                ),
            }
            for p in PROXIES
        }
        # Streaming is real when the body reached the client in several pieces, spread over time (a buffering
        # proxy delivers it in one piece, first content at the end).
        stream["streamed"] = {
            t: stream[t]["reads_min"] > 1 and stream[t]["first_to_last_content_p50_ms"] > 0 for t in TARGETS
        }
        return {"nonstream": nonstream, "stream": stream}

    async def throughput_phase(self) -> dict[str, Any]:
        c = self.counts
        self.set_timing(0.0, 0.0)
        body = chat_body(False)
        ports = {t: int(self.urls[t].rsplit(":", 1)[1]) for t in TARGETS}
        data = {
            t: raw_request(
                ports[t], body, {"x-polarproxy-episode": self.episode} if t == "polarproxy" else {}
            )
            for t in TARGETS
        }
        # warm-up: open and use CONCURRENCY connections once, outside the count (unrecorded episode).
        for t in TARGETS:
            warm = raw_request(ports[t], body, {})
            await burst(ports[t], CONCURRENCY, warm)
        self.sent_to_polarproxy += CONCURRENCY
        seconds = dict.fromkeys(TARGETS, 0.0)
        errors = dict.fromkeys(TARGETS, 0)
        cpu_used = dict.fromkeys(PROXIES, 0.0)
        per_batch = [c.throughput // c.throughput_batches] * c.throughput_batches
        per_batch[-1] += c.throughput - sum(per_batch)
        gc.collect()
        gc.disable()
        try:
            for i, n in enumerate(per_batch):
                k = i % len(TARGETS)
                order = list(TARGETS[k:] + TARGETS[:k])
                for t in order:
                    before = cpu_s(self.procs[t].pid) if t in PROXIES else 0.0
                    dt, err = await burst(ports[t], n, data[t])
                    if t in PROXIES:
                        cpu_used[t] += cpu_s(self.procs[t].pid) - before
                    seconds[t] += dt
                    errors[t] += err
        finally:
            gc.enable()
        self.sent_to_polarproxy += c.throughput
        for p in PROXIES:
            self.cpu[p]["throughput"] = round(cpu_used[p] * 1000 / c.throughput, 3)
        out: dict[str, Any] = {
            "concurrency": CONCURRENCY,
            "requests": c.throughput,
            "batches": c.throughput_batches,
            "stub_first_token_ms": 0.0,
            "stub_per_token_ms": 0.0,
        }
        for t in TARGETS:
            out[t] = {
                "rps": round(c.throughput / seconds[t], 1),
                "seconds": round(seconds[t], 3),
                "errors": errors[t],
            }
        for p in PROXIES:
            out[p]["vs_direct"] = round(out[p]["rps"] / out["direct"]["rps"], 3)
            out[p]["proxy_cpu_ms_per_call"] = self.cpu[p]["throughput"]
            # the proxy process's CPU use while its batches ran (1.0 = one core saturated)
            out[p]["proxy_cores_busy"] = round(cpu_used[p] / seconds[p], 2)
        return out

    def check_recording(self) -> dict[str, Any]:
        from polarproxy.store.store import Store

        store = Store.open(str(self.db))
        try:
            calls = store.list_calls(self.episode)
            statuses: dict[str, int] = {}
            for call in calls:
                statuses[call.status] = statuses.get(call.status, 0) + 1
            total = sum(1 for _ in store.iter_calls())
            total_ok = sum(1 for _ in store.iter_calls(status="ok"))
        finally:
            store.close()
        sent = self.counts.throughput
        return {
            "episode": self.episode,
            "sent": sent,
            "recorded": len(calls),
            "recorded_ok": statuses.get("ok", 0),
            "statuses": statuses,
            "recorded_equals_sent": len(calls) == sent and statuses.get("ok", 0) == sent,
            "all_phases_sent": self.sent_to_polarproxy,
            "all_phases_recorded": total,
            "all_phases_recorded_ok": total_ok,
        }

    async def run(self) -> dict[str, Any]:
        t_start = time.perf_counter()
        self.model_dir = tiny_model()
        from polarproxy.render.renderer import Renderer

        renderer = Renderer(self.model_dir)
        output_ids = [*renderer.encode(TEXT), renderer.stop_token_ids[0]]
        self.db = self.work / "polarproxy-bench.db"
        load_before = os.getloadavg()
        log(
            f"bench: stub answers {len(output_ids)} output tokens ({TEXT!r} + stop), first token "
            f"{FIRST_TOKEN_MS:g} ms, then {PER_TOKEN_MS:g} ms/token (non-streamed: "
            f"{FIRST_TOKEN_MS + PER_TOKEN_MS * (len(output_ids) - 1):g} ms)"
        )
        self.start(output_ids)
        try:
            log(f"bench: targets {self.urls}")
            mem_start = {p: mem_mb(self.procs[p].pid) for p in PROXIES}
            log(
                f"bench: latency, {self.counts.plain_rounds} non-streamed + {self.counts.stream_rounds} streamed "
                "rounds, interleaved ..."
            )
            lat = await self.latency_phases()
            log(
                f"bench: throughput, {self.counts.throughput} requests per target at concurrency {CONCURRENCY} ..."
            )
            tput = await self.throughput_phase()
            mem_end = {p: mem_mb(self.procs[p].pid) for p in PROXIES}
        finally:
            self.stop()
        recording = self.check_recording()
        resources = {
            p: {
                "cpu_ms_per_call": self.cpu[p],
                "after_start": mem_start[p],
                **mem_end[p],
                "shutdown_s": self.shutdown_s.get(p),
            }
            for p in PROXIES
        }
        result: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": {
                "cpus": os.cpu_count(),
                "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                "python": sys.version.split()[0],
            },
            "config": {
                "quick": self.counts is QUICK,
                "output_tokens": len(output_ids),
                "text": TEXT,
                "stub_first_token_ms": FIRST_TOKEN_MS,
                "stub_per_token_ms": PER_TOKEN_MS,
                "warmup_per_target": self.counts.warmup,
                "concurrency": CONCURRENCY,
                "latency_client": "httpx.AsyncClient (keep-alive, one per target)",
                "throughput_client": "raw asyncio HTTP/1.1 keep-alive connections",
                "profile": str(self.profile) if self.profile else None,
            },
            **lat,
            "throughput": tput,
            "recording": recording,
            "resources": resources,
        }
        result["goals"] = goals(result)
        result["elapsed_s"] = round(time.perf_counter() - t_start, 1)
        return result


def goals(r: dict[str, Any]) -> dict[str, Any]:
    pp, bare = "polarproxy", "mitmproxy"
    ns, st, tp = r["nonstream"]["added"], r["stream"]["added"], r["throughput"]
    cpu = {p: r["resources"][p]["cpu_ms_per_call"]["throughput"] for p in PROXIES}

    def ratio(a: float, b: float) -> float:
        return round(a / b, 3) if b > 0 else float("inf")

    values = {
        "added_p50_ratio": ratio(ns[pp]["p50_ms"], ns[bare]["p50_ms"]),
        "added_ttfc_ratio": ratio(st[pp]["ttfc_p50_ms"], st[bare]["ttfc_p50_ms"]),
        "rps_ratio": ratio(tp[pp]["rps"], tp[bare]["rps"]),
        "cpu_ratio": ratio(cpu[pp], cpu[bare]),
        "rss_mb": r["resources"][pp]["hwm_mb"],
    }
    out = {}
    for k, v in values.items():
        limit, kind = GOALS[k]
        met = v >= limit if kind == "min" else v <= limit
        if k == "rps_ratio":
            met = met and r["recording"]["recorded_equals_sent"]
        out[k] = {"value": v, "goal": (">= " if kind == "min" else "<= ") + f"{limit:g}", "met": met}
    return out


def table(r: dict[str, Any]) -> str:
    ns, st, tp, res = r["nonstream"], r["stream"], r["throughput"], r["resources"]
    cfg = r["config"]
    w = [
        f"polarproxy proxy-overhead benchmark, {r['date']}, {r['host']['cpus']} CPUs, load "
        f"{r['host']['loadavg_before'][0]} -> {r['host']['loadavg_after'][0]}",
        f"stub: {cfg['output_tokens']} output tokens, first token {cfg['stub_first_token_ms']:g} ms, "
        f"{cfg['stub_per_token_ms']:g} ms/token; {ns['rounds']} + {st['rounds']} interleaved rounds",
        "",
    ]
    hdr = f"{'':34}" + "".join(f"{t:>12}" for t in TARGETS)
    w.append(hdr)

    def row(label: str, vals: list[Any], fmt: str = "{:>12.2f}") -> None:
        w.append(f"{label:34}" + "".join(fmt.format(v) if v is not None else f"{'-':>12}" for v in vals))

    row("non-streamed p50 ms", [ns[t]["p50_ms"] for t in TARGETS])
    row("non-streamed p99 ms", [ns[t]["p99_ms"] for t in TARGETS])
    row("  added p50 ms (vs direct)", [None, *(ns["added"][p]["p50_ms"] for p in PROXIES)], "{:>+12.2f}")
    row("  added p99 ms (vs direct)", [None, *(ns["added"][p]["p99_ms"] for p in PROXIES)], "{:>+12.2f}")
    row("streamed first content p50 ms", [st[t]["ttfc_p50_ms"] for t in TARGETS])
    row("streamed first content p99 ms", [st[t]["ttfc_p99_ms"] for t in TARGETS])
    row(
        "  added first content p50 ms",
        [None, *(st["added"][p]["ttfc_p50_ms"] for p in PROXIES)],
        "{:>+12.2f}",
    )
    row(
        "  added first content p99 ms",
        [None, *(st["added"][p]["ttfc_p99_ms"] for p in PROXIES)],
        "{:>+12.2f}",
    )
    row("streamed total p50 ms", [st[t]["total_p50_ms"] for t in TARGETS])
    row("stream reads seen by client (min)", [st[t]["reads_min"] for t in TARGETS], "{:>12}")
    row("SSE events (median)", [st[t]["events_median"] for t in TARGETS], "{:>12g}")
    row(f"throughput req/s (conc. {tp['concurrency']})", [tp[t]["rps"] for t in TARGETS], "{:>12.0f}")
    row(
        "proxy CPU ms/call (non-streamed)",
        [None, *(res[p]["cpu_ms_per_call"].get("nonstream") for p in PROXIES)],
    )
    row("proxy CPU ms/call (streamed)", [None, *(res[p]["cpu_ms_per_call"].get("stream") for p in PROXIES)])
    row(
        "proxy CPU ms/call (throughput)",
        [None, *(res[p]["cpu_ms_per_call"].get("throughput") for p in PROXIES)],
    )
    row(
        "proxy RSS MB (end / peak)",
        [None, *(f"{res[p]['rss_mb']:.0f}/{res[p]['hwm_mb']:.0f}" for p in PROXIES)],
        "{:>12}",
    )
    row("shutdown s after SIGINT", [None, *(res[p]["shutdown_s"] for p in PROXIES)])
    errs = {t: ns[t]["errors"] + st[t]["errors"] + tp[t]["errors"] for t in TARGETS}
    row("errors", [errs[t] for t in TARGETS], "{:>12}")
    rec = r["recording"]
    w += [
        "",
        f"recorded: {rec['recorded']} of {rec['sent']} sent ({rec['recorded_ok']} ok) -> recorded == sent: "
        f"{rec['recorded_equals_sent']}; all phases: {rec['all_phases_recorded']} recorded of "
        f"{rec['all_phases_sent']} sent",
        "",
        "goals (polarproxy; ratios to bare mitmproxy in this run):",
    ]
    for k, g in r["goals"].items():
        w.append(f"  {k:20} {g['value']:>9}  goal {g['goal']:>8}  {'met' if g['met'] else 'MISSED'}")
    w.append(f"\nelapsed {r['elapsed_s']} s")
    return "\n".join(w)


def main() -> int:
    ap = argparse.ArgumentParser(
        description="Measure what polarproxy adds over direct calls and bare mitmproxy."
    )
    ap.add_argument("--quick", action="store_true", help="Small counts: a smoke run (~30 s).")
    ap.add_argument("--json", type=Path, help="Write every figure to this JSON file.")
    ap.add_argument("--profile", type=Path, help="Run polarproxy under cProfile and write its stats here.")
    ap.add_argument(
        "--litellm",
        type=Path,
        help="LiteLLM's `litellm` CLI (pip install 'litellm[proxy]'): add its proxy as a fourth target.",
    )
    args = ap.parse_args()
    counts = QUICK if args.quick else FULL
    if args.litellm is not None:
        if not args.litellm.exists():
            log(
                f"Error: --litellm {args.litellm} does not exist. Install it with pip install 'litellm[proxy]'."
            )
            return 1
        global TARGETS, PROXIES
        TARGETS, PROXIES = (*TARGETS, LITELLM), (*PROXIES, LITELLM)
    with tempfile.TemporaryDirectory(prefix="polarproxy-bench-") as work:
        bench = Bench(counts, Path(work), args.profile.resolve() if args.profile else None, args.litellm)
        try:
            result = asyncio.run(bench.run())
        finally:
            bench.stop()
    print(table(result))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2) + b"\n")
        log(f"bench: wrote {args.json}")
    if args.profile:
        import pstats

        print(f"\ncProfile of the polarproxy process (main thread), top 25 by own time ({args.profile}):")
        pstats.Stats(str(args.profile)).sort_stats("tottime").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
