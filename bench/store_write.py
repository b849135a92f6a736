"""Store benchmark: write throughput, storage per token, and read/rebuild speed, SQLite and PostgreSQL side
by side in one run.

    python bench/store_write.py [--quick] [--json bench/results/store.json]

- **write**: W writer processes, each the proxy's own writer (StoreWriter: one thread, group commit) with
  E concurrent agent-like episodes (each call: begin_call with a prompt that extends the previous call by
  its output and new tokens, then finish_call), into one database. Shapes W x E: 1x1 (one serial episode),
  4x8, 4x32 (the target shape: a fleet's 4 writers) and 1x32 (one writer of a fleet node). Reported: calls/s, tokens/s
  (prompt + output tokens of the calls written), the writer processes' CPU per call and the writer
  threads' own. The synthetic agents' calls are made before the clock starts, so the CPU figures are the
  store path's (the writer thread, the asyncio side of awaiting it), not the test harness's. With the
  throwaway cluster, the PostgreSQL server's CPU per call too ("server": its processes, from /proc), since
  on one machine the writers and the server share the cores.
- **storage**: one 100-turn episode stored linearly (each call stores only the tokens it adds) and whole
  (every prompt in full, as stores that do not share prefixes keep them): token-array bytes and the whole database size, each per
  distinct token, against the raw size of the distinct tokens (4 bytes per ID).
- **read**: the 100-turn episode read back with every prompt rebuilt (what export does): calls/s and
  tokens/s.

PostgreSQL: $POLARPROXY_BENCH_PG (a database URL on a server where the bench may create databases), else
a throwaway PostgreSQL 15 cluster (tests/pgcluster.py), else the PostgreSQL figures are left out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import sys
import tempfile
import time
import uuid
from array import array
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from polarproxy.store import CallResult, CallStart, EpisodeStart, Store  # noqa: E402

WORDS = [
    "the",
    "agent",
    "reads",
    "a",
    "file",
    "then",
    "edits",
    "the",
    "code",
    "and",
    "runs",
    "the",
    "tests",
    "again",
    "until",
    "they",
    "pass",
]


def _text(rng: random.Random, tokens: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(tokens))  # ~4-5 characters a token, like prose


class Agent:
    """One episode's calls: prompt = previous prompt + previous output + new tokens (T2), request bodies
    that repeat the whole history (as harnesses send them)."""

    def __init__(self, seed: int, new_tokens: int = 60, output_tokens: int = 40) -> None:
        self.rng = random.Random(seed)
        self.new_tokens, self.output_tokens = new_tokens, output_tokens
        self._pool = [self.rng.randrange(150_000) for _ in range(8192)]  # token IDs, drawn once (cheap)
        # The prompt as the proxy hands it to the store: an int32 array (render/prefix.py Prompt.tokens).
        self.prompt = array("i", self._ids(400))  # system prompt + tools
        self.messages: list[dict[str, str]] = [{"role": "system", "content": _text(self.rng, 400)}]
        self.prev: str | None = None

    def _ids(self, n: int) -> list[int]:
        at = self.rng.randrange(len(self._pool) - n)
        return self._pool[at : at + n]

    def start(self, episode_id: str) -> CallStart:
        self.messages.append({"role": "user", "content": _text(self.rng, self.new_tokens)})
        body = json.dumps({"model": "m", "messages": self.messages})
        conversation = {"messages": list(self.messages), "tools": []}  # a snapshot: later turns append
        return CallStart(
            episode_id=episode_id,
            dialect="openai_chat",
            method="POST",
            path="/v1/chat/completions",
            model="m",
            stream=True,
            request_headers={"content-type": "application/json"},
            request_body=body,
            conversation=conversation,
            prompt_ids=self.prompt,  # never changed in place: each call's prompt is a new array
            render_mode="extended" if self.prev else "fresh",
            extended_from=self.prev,
        )

    def result(self, call_id: str) -> CallResult:
        output = self._ids(self.output_tokens)
        text = _text(self.rng, self.output_tokens)
        self.messages.append({"role": "assistant", "content": text})
        self.prompt = self.prompt + array("i", output) + array("i", self._ids(self.new_tokens))
        self.prev = call_id
        return CallResult(
            status="ok",
            http_status=200,
            response_body=json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}),
            completion={"text": text, "tool_calls": [], "finish_reason": "stop"},
            output_ids=output,
            output_logprobs=[-0.25] * len(output),
            finish_reason="stop",
            latency_ms=1.0,
        )


def _workload(seed: int, episodes: int, calls: int) -> list[list[tuple[CallStart, CallResult, int]]]:
    """Each episode's calls, made ahead: (start with a placeholder episode and base, result, tokens)."""
    work = []
    for i in range(episodes):
        agent, ep = Agent(seed * 1000 + i), []
        for k in range(calls):
            start = agent.start("")
            tokens = len(agent.prompt)
            result = agent.result(f"call-{k}")
            ep.append((start, result, tokens + len(result.output_ids)))
        work.append(ep)
    return work


def _writer_process(url: str, episodes: int, calls: int, seed: int, ready: Any, start: Any, out: Any) -> None:
    from dataclasses import replace

    from polarproxy.store.writer import StoreWriter

    store = Store.open(url)
    writer = StoreWriter(store)
    work = _workload(seed, episodes, calls)
    ready.put(seed)

    async def episode(calls: list[tuple[CallStart, CallResult, int]]) -> int:
        eid = await writer.create_episode(EpisodeStart(command=["bench"]))
        prev: str | None = None
        for start, result, _ in calls:
            cid, _ = await writer.begin_call(replace(start, episode_id=eid, extended_from=prev))
            await writer.finish_call(cid, result)
            prev = cid
        return sum(t for _, _, t in calls)

    async def main() -> int:
        return sum(await asyncio.gather(*(episode(ep) for ep in work)))

    start.wait()
    clock = time.pthread_getcpuclockid(writer._thread.ident or 0)
    t0, cpu0, thread0 = time.perf_counter(), time.process_time(), time.clock_gettime(clock)
    tokens = asyncio.run(main())
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    out.put((wall, tokens, cpu, time.clock_gettime(clock) - thread0))
    writer.close()
    store.close()


def server_cpu_s(data_dir: Path) -> float:
    """CPU seconds a PostgreSQL server has used: the postmaster's own and its reaped children's, plus those
    of its children still running (backends, WAL writer, checkpointer). /proc only (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")

    def fields(pid: int) -> list[str]:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2 :].split()  # from field 3 (state) on

    master = int((data_dir / "postmaster.pid").read_text().split()[0])
    while True:
        # A child reaped between reading the postmaster and listing /proc would be counted nowhere (its time
        # reaches the postmaster's cutime only when reaped), so the postmaster is read before and after the
        # children, and the sum is taken only when no child was reaped in between.
        f = fields(master)
        total = sum(int(x) for x in f[11:15])  # utime, stime, cutime, cstime
        for entry in os.listdir("/proc"):
            if entry.isdigit() and entry != str(master):
                try:
                    g = fields(int(entry))
                except OSError:  # gone meanwhile: reaped, so the postmaster's cutime changes too
                    continue
                if int(g[1]) == master:  # running or exited (a zombie keeps its times until reaped)
                    total += int(g[11]) + int(g[12])
        if fields(master)[13:15] == f[13:15]:
            return total / tick


def bench_write(
    url: str, writers: int, episodes_each: int, calls: int, server: Path | None = None
) -> dict[str, float]:
    """`server`: the PostgreSQL data folder of a server this run alone uses, to count its CPU too."""
    Store.open(url).close()  # migrate once, outside the timing
    ctx = multiprocessing.get_context("spawn")
    ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_writer_process, args=(url, episodes_each, calls, w, ready, start, out))
        for w in range(writers)
    ]
    for p in procs:
        p.start()
    for _ in procs:  # every process has imported everything and opened the store
        ready.get(timeout=300)
    server0 = None if server is None else server_cpu_s(server)
    t0 = time.perf_counter()
    start.set()
    results = [out.get(timeout=600) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join(60)
    server_s = None if server0 is None else server_cpu_s(server) - server0  # its backends have ended
    n = writers * episodes_each * calls
    wall = max(wall, max(r[0] for r in results))
    return {
        "writers": writers,
        "episodes_per_writer": episodes_each,
        "concurrent_episodes": writers * episodes_each,
        "calls": n,
        "seconds": round(wall, 3),
        "calls_per_s": round(n / wall, 1),
        "tokens_per_s": round(sum(r[1] for r in results) / wall, 1),
        # the writer processes' CPU (the database server's not counted), and their writer threads' alone
        "writer_cpu_ms_per_call": round(1000 * sum(r[2] for r in results) / n, 3),
        "writer_thread_cpu_ms_per_call": round(1000 * sum(r[3] for r in results) / n, 3),
        # the database server's CPU (PostgreSQL started by this bench only; SQLite has no server)
        "server_cpu_ms_per_call": None if server_s is None else round(1000 * server_s / n, 3),
        "load_average_1m": round(os.getloadavg()[0], 1),
    }


def _sizes(store: Store) -> tuple[int, int]:
    """(token-array bytes, whole database bytes) of the store's database."""
    from sqlalchemy import func, select, text

    from polarproxy.store.schema import calls as c

    with store.engine.connect() as conn:
        tokens = conn.execute(
            select(
                func.sum(
                    func.length(c.c.prompt_tail_ids)
                    + func.length(c.c.output_ids)
                    + func.length(c.c.output_logprobs)
                )
            )
        ).scalar_one()
        if store.dialect == "postgresql":
            total = conn.execute(
                text(
                    "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace n "
                    "ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r'"
                )
            ).scalar_one()
    if store.dialect == "sqlite":
        import sqlite3

        raw = sqlite3.connect(store.connect_url.removeprefix("sqlite:///"), isolation_level=None)
        raw.execute("VACUUM")
        total = raw.execute("PRAGMA page_count").fetchone()[0] * raw.execute("PRAGMA page_size").fetchone()[0]
        raw.close()
    return int(tokens), int(total)


def _vacuum_pg(url: str) -> None:
    import psycopg

    from polarproxy.store.urls import sqlalchemy_url

    plain = sqlalchemy_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute("VACUUM FULL")


def bench_storage_and_read(url: str, turns: int, *, linear: bool) -> dict[str, float]:
    store = Store.open(url)
    if not linear:
        store._choose_base = lambda start, prompt: None  # type: ignore[method-assign]  # every prompt whole
    eid = store.create_episode(EpisodeStart(command=["bench"]))
    agent = Agent(7)
    logical = 0
    for _ in range(turns):
        cid, _ = store.begin_call(agent.start(eid))
        logical += len(agent.prompt)
        result = agent.result(cid)
        store.finish_call(cid, result)
        logical += len(result.output_ids)
    calls = store.list_calls(eid)
    distinct = len(calls[-1].prompt_ids) + len(calls[-1].output_ids)
    outputs = sum(len(c.output_ids) for c in calls)
    if store.dialect == "postgresql":
        _vacuum_pg(url)
    token_bytes, total_bytes = _sizes(store)
    t0 = time.perf_counter()
    rounds = 0
    while rounds < 3 or time.perf_counter() - t0 < 1.0:
        read = list(store.iter_calls([eid]))
        rounds += 1
    read_s = (time.perf_counter() - t0) / rounds
    assert [c.prompt_ids for c in read] == [c.prompt_ids for c in calls]
    store.close()
    raw = 4 * distinct  # the distinct token IDs as int32
    return {
        "turns": turns,
        "distinct_tokens": distinct,
        "tokens_in_calls": logical,
        "raw_distinct_bytes": raw,
        "token_array_bytes": token_bytes,  # prompt tails + output IDs + output logprobs
        "token_ids_per_distinct_token_bytes": round((token_bytes - 4 * outputs) / distinct, 2),
        "token_arrays_vs_raw": round(token_bytes / raw, 3),
        "database_bytes": total_bytes,
        "database_vs_raw": round(total_bytes / raw, 2),
        "database_bytes_per_distinct_token": round(total_bytes / distinct, 1),
        "read_calls_per_s": round(turns / read_s, 1),
        "read_tokens_per_s": round(logical / read_s, 1),
    }


def _pg_admin() -> tuple[str | None, Any]:
    env = os.environ.get("POLARPROXY_BENCH_PG")
    if env:
        return env, None
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from pgcluster import start_cluster

        cluster = start_cluster()
    except Exception as exc:  # no PostgreSQL here: SQLite figures only
        print(f"PostgreSQL left out: {exc}", file=sys.stderr)
        return None, None
    return cluster.url, cluster


def _new_pg_db(admin: str) -> str:
    import psycopg
    from sqlalchemy.engine import make_url

    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return make_url(admin).set(database=name).render_as_string(hide_password=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--write-only", action="store_true", help="only the write figures (no storage/read)")
    ap.add_argument("--calls", type=int, help="calls per episode of the 4x8 shape (others scale from it)")
    args = ap.parse_args()
    calls, turns = (4, 12) if args.quick else (20, 100)
    calls = args.calls or calls
    tmp = Path(tempfile.mkdtemp(prefix="polarproxy-bench-"))
    admin, cluster = _pg_admin()
    results: dict[str, Any] = {"write": {}, "storage": {}, "cpus": os.cpu_count(), "quick": args.quick}
    try:
        backends = {"sqlite": lambda tag: str(tmp / f"{tag}.db")}
        if admin:
            backends["postgresql"] = lambda tag: _new_pg_db(admin)
        for name, new_db in backends.items():
            server = cluster.data if name == "postgresql" and cluster is not None else None
            write = partial(bench_write, server=server)
            results["write"][name] = {  # writers x episodes each
                "1x1": write(new_db("w1"), 1, 1, calls * 4),
                "4x8": write(new_db("w32"), 4, 8, calls),
                "4x32": write(new_db("w128"), 4, 32, max(2, calls // 2)),  # the target shape
                "1x32": write(new_db("w1x32"), 1, 32, max(2, calls // 2)),  # and its one-writer figure
            }
            if args.write_only:
                continue
            results["storage"][name] = {
                "linear": bench_storage_and_read(new_db("lin"), turns, linear=True),
                "whole": bench_storage_and_read(new_db("whole"), turns, linear=False),
            }
    finally:
        if cluster is not None:
            cluster.destroy()
    _print(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


def _or_dash(value: float | None) -> str:
    return "-" if value is None else str(value)


def _print(r: dict[str, Any]) -> None:
    print(f"\nwrite throughput (StoreWriter group commit; {r['cpus']} CPUs)")
    print(
        f"{'backend':<11}{'episodes':>9}{'writers':>8}{'calls':>7}{'calls/s':>10}{'tokens/s':>12}"
        f"{'CPU ms/call':>12}{'thread':>8}{'server':>8}{'load':>6}"
    )
    for name, by in r["write"].items():
        for w in by.values():
            print(
                f"{name:<11}{w['concurrent_episodes']:>9}{w['writers']:>8}{w['calls']:>7}"
                f"{w['calls_per_s']:>10}{w['tokens_per_s']:>12}{w['writer_cpu_ms_per_call']:>12}"
                f"{w['writer_thread_cpu_ms_per_call']:>8}{_or_dash(w.get('server_cpu_ms_per_call')):>8}"
                f"{w['load_average_1m']:>6}"
            )
    print("\nstorage and read-back of one episode (linear = each call stores only the tokens it adds)")
    print(
        f"{'backend':<11}{'layout':<8}{'turns':>6}{'distinct':>9}{'arrays/raw':>11}{'db bytes':>11}"
        f"{'db/raw':>8}{'read calls/s':>13}{'read tok/s':>12}"
    )
    for name, by in r["storage"].items():
        for layout, s in by.items():
            print(
                f"{name:<11}{layout:<8}{s['turns']:>6}{s['distinct_tokens']:>9}{s['token_arrays_vs_raw']:>11}"
                f"{s['database_bytes']:>11}{s['database_vs_raw']:>8}{s['read_calls_per_s']:>13}"
                f"{s['read_tokens_per_s']:>12}"
            )
        lin, whole = by["linear"], by["whole"]
        print(
            f"{name}: whole/linear token arrays {whole['token_array_bytes'] / lin['token_array_bytes']:.1f}x, "
            f"database {whole['database_bytes'] / lin['database_bytes']:.1f}x"
        )


if __name__ == "__main__":
    main()
