"""Episodes per hour of the pipelined `rollout` against a synchronous baseline, on heavy-tailed episodes.

    python bench/rollout_throughput.py [--quick] [--episodes 64] [--concurrency 8] [--json OUT]

Both modes run the same episodes through the same in-process gateway (rollout/episodes.py `LocalGateway`,
the one `polarproxy rollout --backend ... --db ...` starts) in front of a fixed-answer backend double
(backends/stub.py), with the same stage functions (rollout/stages.py: prewarm, execute, evaluate,
reconstruct):

  pipelined  one `Rollout` over every (task, sample) with rollout's own worker pools (prewarm
             concurrency/2, execute concurrency, evaluate concurrency/2, reconstruct 1): an execute slot
             takes the next prewarmed episode as soon as it frees.
  baseline   batches of `concurrency` episodes, each a `Rollout` with every pool `concurrency` wide; the
             next batch starts when the slowest episode of this one is evaluated (the synchronous loop:
             generate a batch, wait for all of it, go on).

The agent is this script (`--agent`): it reads its episode's drawn length from `durations.json` in its
workspace (keyed by the sample, the name of the workspace's parent folder), makes one Chat Completions
call through the gateway with the episode's key, sleeps out the rest of its length and writes
answer.txt; `verify` checks that file. Lengths are drawn once, seeded, from a Pareto distribution (alpha
1.1) truncated to [base, 10 x base]: tenfold, with a heavy tail. A task's `setup` sleeps `--prewarm`
seconds (environment preparation). The modes alternate (A B, then B A, ...), `--repeats` times each.

Figures per run: wall seconds, episodes per hour, run-slot utilisation (execute-slot busy seconds /
(concurrency x wall)), the execute-slot seconds left idle while episodes were still waiting to run
(before the last execute start: they were not prewarmed yet), split into the pipeline's fill (before
`concurrency` episodes had started) and the steady state after it, and per-stage queue seconds (from
rollout's own summary), and where an execute stage's time goes (until the agent runs: the episode's
creation and the process start; its model call; after it exits). Prewarm counts as hidden behind
execution when the steady-state idle slot time is at most 2 % of the busy slot time. `ideal` is the bound
for the same lengths with no overhead at all: list scheduling in the rollout's order against batches that
wait for their longest (what a scheduler that keeps every slot busy, taking the episodes in this order,
can at best do).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ALPHA = 1.1  # Pareto tail index: the smaller, the heavier the tail
SPREAD = 10.0  # longest / shortest episode
TARGET_RATIO = 2.0
TARGET_UTILISATION = 0.85
HIDDEN_IDLE_SHARE = 0.02
STAGES = ("prewarm", "execute", "evaluate", "reconstruct")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the agent (run by the rollout as `python bench/rollout_throughput.py --agent`) --------------------


def agent() -> int:
    """One model call through the gateway, then sleep out the episode's drawn length. Imports only what it
    needs of the stdlib (the rollout runs it with `python -S -I`), so that it starts quickly."""
    import http.client
    from urllib.parse import urlsplit

    t0 = time.monotonic()
    workspace = os.getcwd()
    with open(os.path.join(workspace, "durations.json")) as f:
        seconds = float(json.load(f)[os.path.basename(os.path.dirname(workspace))])
    base = urlsplit(os.environ["OPENAI_BASE_URL"].rstrip("/"))
    body = {"messages": [{"role": "user", "content": os.environ.get("POLARPROXY_INSTRUCTION", "go")}]}
    conn = http.client.HTTPConnection(base.hostname or "127.0.0.1", base.port or 80, timeout=120)
    headers = {"content-type": "application/json", "authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"}
    conn.request("POST", base.path + "/chat/completions", json.dumps(body), headers)
    r = conn.getresponse()
    if r.status != 200:
        print(f"model call failed: HTTP {r.status}: {r.read()[:500]!r}", file=sys.stderr)
        return 1
    answer = json.loads(r.read())["choices"][0]["message"]["content"] or "done"
    conn.close()
    called = time.monotonic()
    time.sleep(max(0.0, seconds - (called - t0)))
    with open(os.path.join(workspace, "answer.txt"), "w") as f:
        f.write(answer + "\n")
    if os.environ.get("BENCH_AGENT_LOG"):  # where the time of an execute stage goes (figures())
        line = {"workspace": workspace, "start": t0, "call_s": called - t0, "end": time.monotonic()}
        with open(os.environ["BENCH_AGENT_LOG"], "a") as f:
            f.write(json.dumps(line) + "\n")
    return 0


# -- episodes -----------------------------------------------------------------------------------------


def draw_lengths(n: int, base: float, seed: int) -> list[float]:
    """n lengths from a Pareto(ALPHA) truncated to [base, SPREAD x base] (inverse CDF), seeded."""
    import random

    rng = random.Random(seed)
    low, high = base, base * SPREAD
    tail = 1.0 - (low / high) ** ALPHA
    return [low / (1.0 - rng.random() * tail) ** (1.0 / ALPHA) for _ in range(n)]


def write_tasks(root: Path, tasks: int, samples: int, base: float, prewarm: float, seed: int) -> list[Any]:
    """`tasks` tasks whose workspaces hold each sample's drawn length; returns rollout Tasks."""
    from polarproxy.rollout.tasks import load_tasks

    lengths = draw_lengths(tasks * samples, base, seed)
    lines = []
    for t in range(tasks):
        ws = root / f"t{t:03d}" / "workspace"
        ws.mkdir(parents=True)
        mine = lengths[t * samples : (t + 1) * samples]
        (ws / "durations.json").write_text(json.dumps({str(i): d for i, d in enumerate(mine)}))
        task: dict[str, Any] = {
            "id": f"t{t:03d}",
            "instruction": f"task {t}",
            "workspace": f"t{t:03d}/workspace",
            "verify": "test -s answer.txt",
            "timeout_s": 120,
        }
        if prewarm > 0:
            task["setup"] = [f"sleep {prewarm:.3f}"]
        lines.append(json.dumps(task))
    (root / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    return load_tasks(root / "tasks.jsonl")


class Backend:
    """The fixed-answer backend double on its own event loop in a thread."""

    def __init__(self, model_dir: Path) -> None:
        import asyncio
        import threading

        from polarproxy.backends.stub import StubBackend, StubConfig
        from polarproxy.render.renderer import Renderer

        renderer = Renderer(model_dir)
        ids = [*renderer.encode("Done."), renderer.stop_token_ids[0]]
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.stub = StubBackend(StubConfig(output_ids=ids, weight_version="0"))
        port = asyncio.run_coroutine_threadsafe(self.stub.start(), self.loop).result(30)
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self.stub.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


# -- the two modes ------------------------------------------------------------------------------------


def run_mode(mode: str, tasks: list[Any], samples: int, concurrency: int, settings: Any, tag: str) -> dict:
    """Run every (task, sample) once in `mode`; the jobs, their rollout summaries and the wall time."""
    import dataclasses

    from polarproxy.rollout.run import Plan, Rollout, summary

    agent_log = Path(os.environ["BENCH_AGENT_LOG"])
    agent_log.write_text("")
    t0 = time.monotonic()
    jobs: list[Any] = []
    summaries = []
    if mode == "pipelined":
        batches = [tasks]
        workers: dict[str, int] = {}
    else:
        per_batch = max(1, concurrency // samples)
        batches = [tasks[i : i + per_batch] for i in range(0, len(tasks), per_batch)]
        workers = dict.fromkeys(STAGES, concurrency)
    for k, batch in enumerate(batches):
        s = dataclasses.replace(settings, rollout_id=f"bench-{tag}-{mode}-{k}")
        b0 = time.monotonic()
        done = Rollout(Plan(batch, samples, concurrency, workers=workers), s).run()
        summaries.append(summary(done, s, wall_s=time.monotonic() - b0))
        jobs += done
    wall = time.monotonic() - t0
    agents = {a["workspace"]: a for a in map(json.loads, agent_log.read_text().splitlines())}
    return {"jobs": jobs, "summaries": summaries, "t0": t0, "wall_s": wall, "agents": agents}


def ideal(lengths: list[float], slots: int) -> dict[str, float]:
    """Wall seconds of both schedules for these lengths with no overhead at all (the bound of the ratio):
    list scheduling in the rollout's order against batches of `slots` that wait for their longest."""
    import heapq

    free = [0.0] * slots
    for d in lengths:
        heapq.heappush(free, heapq.heappop(free) + d)
    pipelined = max(free)
    baseline = sum(max(lengths[i : i + slots]) for i in range(0, len(lengths), slots))
    return {
        "pipelined_wall_s": round(pipelined, 3),
        "baseline_wall_s": round(baseline, 3),
        "ratio": round(baseline / pipelined, 3),
        "utilisation": round(sum(lengths) / (slots * pipelined), 4),
    }


def idle_slot_seconds(intervals: list[tuple[float, float]], slots: int, start: float, end: float) -> float:
    """Integral over [start, end] of (slots - busy), busy = how many intervals cover the moment."""
    if end <= start:
        return 0.0
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    busy, t, idle = 0, start, 0.0
    for when, change in events:
        if when > t:
            lo, hi = max(t, start), min(when, end)
            if hi > lo:
                idle += (slots - min(busy, slots)) * (hi - lo)
            t = when
        busy += change
    if end > t:
        idle += (slots - min(busy, slots)) * (end - max(t, start))
    return idle


def figures(run: dict, concurrency: int) -> dict[str, Any]:
    import statistics

    jobs = run["jobs"]
    done = [j for j in jobs if j.state == "done" and j.reward == 1.0]
    execs = sorted((j.started["execute"], j.ended["execute"]) for j in jobs if "execute" in j.ended)
    wall = run["wall_s"]
    busy = sum(b - a for a, b in execs)
    starts = [a for a, _ in execs]
    t0 = run["t0"]
    fill_end = starts[min(concurrency, len(starts)) - 1] if starts else t0
    last_start = starts[-1] if starts else t0
    fill_idle = idle_slot_seconds(execs, concurrency, t0, fill_end)
    steady_idle = idle_slot_seconds(execs, concurrency, fill_end, last_start)
    queue: dict[str, dict[str, float]] = {}
    for st in STAGES:
        waits = [j.started[st] - j.queued[st] for j in jobs if st in j.started and st in j.queued]
        queue[st] = {
            "mean_s": round(statistics.fmean(waits), 4) if waits else 0.0,
            "max_s": round(max(waits), 4) if waits else 0.0,
        }
    prewarm = [j.ended["prewarm"] - j.started["prewarm"] for j in jobs if "prewarm" in j.ended]
    ran = [(j, run["agents"][str(j.workspace)]) for j in jobs if str(j.workspace) in run["agents"]]
    split = {  # an execute stage: until the agent runs (episode created, process started), its call, after
        "before_agent_s": [a["start"] - j.started["execute"] for j, a in ran],
        "model_call_s": [a["call_s"] for _, a in ran],
        "after_agent_s": [j.ended["execute"] - a["end"] for j, a in ran],
    }
    return {
        "episodes": len(jobs),
        "done": len(done),
        "wall_s": round(wall, 3),
        "episodes_per_hour": round(len(done) / wall * 3600, 1) if wall > 0 else None,
        "utilisation": round(busy / (concurrency * wall), 4) if wall > 0 else None,
        "execute_busy_slot_s": round(busy, 3),
        "execute_mean_s": round(busy / len(execs), 3) if execs else None,
        "prewarm_s": round(sum(prewarm), 3),
        "idle_waiting_fill_slot_s": round(fill_idle, 3),
        "idle_waiting_steady_slot_s": round(steady_idle, 3),
        "prewarm_hidden": steady_idle <= HIDDEN_IDLE_SHARE * busy,
        "queue_s": queue,
        "execute_split_mean_s": {k: round(statistics.fmean(v), 4) if v else None for k, v in split.items()},
    }


def bench(args: Any) -> dict[str, Any]:
    import shutil
    import statistics
    import tempfile

    from polarproxy.capture.stack import ProxyConfig
    from polarproxy.rollout.episodes import LocalGateway
    from polarproxy.rollout.sandbox import get_runner
    from polarproxy.rollout.stages import Settings

    if args.episodes % args.samples or args.concurrency % args.samples:
        raise SystemExit(
            "--episodes and --concurrency must be multiples of --samples (whole groups per batch)"
        )
    model_dir = Path(args.model) if args.model else _tiny_model()
    root = Path(tempfile.mkdtemp(prefix="polarproxy-rollout-bench-"))
    tasks = write_tasks(root, args.episodes // args.samples, args.samples, args.base, args.prewarm, args.seed)
    lengths = draw_lengths(args.episodes, args.base, args.seed)
    backend = Backend(model_dir)
    gateway = LocalGateway(ProxyConfig(backend=backend.url, model=model_dir, db=str(root / "bench.db")))
    settings = Settings(
        rollout_id="bench",
        episodes=gateway,
        runner=get_runner(args.isolation),
        command=[
            sys.executable,
            "-S",
            "-I",
            str(Path(__file__).resolve()),
            "--agent",
        ],  # stdlib only: a quick start
        model_name="tiny",
        pass_env=["BENCH_AGENT_LOG"],
    )
    os.environ["BENCH_AGENT_LOG"] = str(root / "agents.jsonl")  # the agents get it (--pass-env)
    runs: dict[str, list[dict[str, Any]]] = {"pipelined": [], "baseline": []}
    try:
        for r in range(args.repeats):
            order = ("pipelined", "baseline") if r % 2 == 0 else ("baseline", "pipelined")
            for mode in order:
                log(f"bench: {mode} run {r + 1}/{args.repeats} ...")
                run = run_mode(mode, tasks, args.samples, args.concurrency, settings, str(r))
                f = figures(run, args.concurrency)
                runs[mode].append(f)
                log(f"  {f['wall_s']} s, {f['episodes_per_hour']} episodes/h, utilisation {f['utilisation']}")
    finally:
        gateway.close()
        backend.stop()
        shutil.rmtree(root, ignore_errors=True)
    med = {m: statistics.median(x["episodes_per_hour"] for x in rs) for m, rs in runs.items()}
    util = statistics.median(x["utilisation"] for x in runs["pipelined"])
    ratio = med["pipelined"] / med["baseline"] if med["baseline"] else None
    return {
        "config": {
            "episodes": args.episodes,
            "concurrency": args.concurrency,
            "samples": args.samples,
            "base_s": args.base,
            "spread": SPREAD,
            "alpha": ALPHA,
            "prewarm_s": args.prewarm,
            "repeats": args.repeats,
            "isolation": settings.runner.name,
            "seed": args.seed,
        },
        "lengths": {
            "min_s": round(min(lengths), 3),
            "median_s": round(statistics.median(lengths), 3),
            "mean_s": round(statistics.fmean(lengths), 3),
            "max_s": round(max(lengths), 3),
        },
        "ideal": ideal(lengths, args.concurrency),
        "runs": runs,
        "episodes_per_hour": med,
        "ratio": round(ratio, 3) if ratio else None,
        "utilisation": util,
        "prewarm_hidden": all(x["prewarm_hidden"] for x in runs["pipelined"]),
        "targets": {"ratio": TARGET_RATIO, "utilisation": TARGET_UTILISATION},
        "met": {
            "ratio": bool(ratio and ratio >= TARGET_RATIO),
            "utilisation": util >= TARGET_UTILISATION,
        },
        "load_average": list(os.getloadavg()),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def _tiny_model() -> Path:
    sys.path.insert(0, str(REPO / "bench"))
    from export_speed import tiny_model  # the bench scripts' shared random-weight tiny model

    return tiny_model()


def report(r: dict[str, Any]) -> None:
    import statistics

    c, ln = r["config"], r["lengths"]
    print(
        f"{c['episodes']} episodes ({c['episodes'] // c['samples']} tasks x {c['samples']}), concurrency "
        f"{c['concurrency']}, lengths {ln['min_s']}..{ln['max_s']} s (median {ln['median_s']}, mean "
        f"{ln['mean_s']}), prewarm {c['prewarm_s']} s, isolation {c['isolation']}, {c['repeats']} run(s) each"
    )
    print(f"{'':<28}{'pipelined':>12}{'baseline':>12}")
    rows = [
        ("wall s", "wall_s"),
        ("episodes / hour", "episodes_per_hour"),
        ("run-slot utilisation", "utilisation"),
        ("execute s per episode", "execute_mean_s"),
        ("idle slot s, fill", "idle_waiting_fill_slot_s"),
        ("idle slot s, steady", "idle_waiting_steady_slot_s"),
    ]
    for label, key in rows:
        p = statistics.median(x[key] for x in r["runs"]["pipelined"])
        b = statistics.median(x[key] for x in r["runs"]["baseline"])
        print(f"{label:<28}{p:>12.3f}{b:>12.3f}")
    for key in ("before_agent_s", "model_call_s", "after_agent_s"):
        p = statistics.median(x["execute_split_mean_s"][key] for x in r["runs"]["pipelined"])
        b = statistics.median(x["execute_split_mean_s"][key] for x in r["runs"]["baseline"])
        print(f"{'execute: ' + key[:-2].replace('_', ' ') + ' s':<28}{p:>12.3f}{b:>12.3f}")
    for st in STAGES:
        p = statistics.median(x["queue_s"][st]["mean_s"] for x in r["runs"]["pipelined"])
        b = statistics.median(x["queue_s"][st]["mean_s"] for x in r["runs"]["baseline"])
        print(f"{'queue s, ' + st + ' (mean)':<28}{p:>12.3f}{b:>12.3f}")
    met = r["met"]
    print(
        f"pipelined / baseline = {r['ratio']}x (target >= {TARGET_RATIO}: {'met' if met['ratio'] else 'NOT met'}); "
        f"utilisation {r['utilisation']:.3f} (target >= {TARGET_UTILISATION}: "
        f"{'met' if met['utilisation'] else 'NOT met'}); prewarm hidden behind execution: {r['prewarm_hidden']}"
    )
    i = r["ideal"]
    print(
        f"with no overhead these lengths would give {i['ratio']}x and utilisation {i['utilisation']:.3f} "
        f"({i['pipelined_wall_s']} s vs {i['baseline_wall_s']} s)"
    )
    print(f"load average {', '.join(f'{x:.2f}' for x in r['load_average'])}; {r['date']}")


def main(argv: list[str] | None = None) -> int:
    if (sys.argv[1:] if argv is None else argv) == ["--agent"]:
        return agent()
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--quick", action="store_true", help="a small run (smoke test): 8 episodes, short lengths")
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--samples", type=int, default=4, help="samples per task (a group)")
    p.add_argument("--base", type=float, default=1.0, help="shortest episode, seconds (the longest is 10x)")
    p.add_argument("--prewarm", type=float, default=0.1, help="seconds each task's setup sleeps")
    p.add_argument("--repeats", type=int, default=2, help="runs of each mode, interleaved")
    p.add_argument("--isolation", default="none", help="none | bwrap (the sandbox of each agent)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", help="model folder (tokenizer + template; default: the bench tiny model)")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    if args.quick:
        args.episodes, args.concurrency, args.samples = 8, 4, 2
        args.base, args.prewarm, args.repeats = 0.05, 0.02, 1
    result = bench(args)
    report(result)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    failed = sum(x["episodes"] - x["done"] for rs in result["runs"].values() for x in rs)
    if failed:
        log(f"bench: {failed} episode(s) did not finish with reward 1.0")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
