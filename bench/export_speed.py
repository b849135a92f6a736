"""Reconstruction and export speed, and the per-turn cost of prefix-preserving prompts.

    python bench/export_speed.py [--quick] [--episodes N] [--calls N] [--context N] [--json OUT]
                                 [--db PATH] [--profile STRATEGY:FORMAT:PATH] [--no-prompts]
                                 [--formats FORMAT,...]

Export phase. A synthetic SQLite store (default 1,000 episodes x 30 calls whose context grows to 8,192
tokens) is written through the Store API (`begin_call` / `finish_call`, call k of 10 episodes per group commit),
the way the proxy records: every call extends the one before it (an agent loop), its prompt is the
earlier prompt + the earlier output + ~200 new tokens, and it samples ~70 tokens with logprobs. Token IDs
are random in [0, 150000), so they are not Python's small cached ints. Then, side by side in one run, each
in a fresh child process that opens the store, reconstructs and writes the file the way `polarproxy export`
does: `read` (Store.iter_calls alone, the plain path's floor) and `read arrays` (store/token_calls.py alone,
the array path's), then per-request x {jsonl, parquet} and prefix-merge x {jsonl, parquet}, each by the
plain path (Call objects, list trajectories: `run_export(plain=True)`) and by the array path (the default),
one after the other, and by the array path from two processes (`jobs2`: `run_export(jobs=2)`, what
`polarproxy export --jobs 2` does; its CPU figure adds the worker's, its peak memory is the larger of the
two processes'). Figures per run: seconds, CPU seconds, recorded tokens per second (the prompt + output
of every call read: the same work for both strategies), written tokens per second and per CPU-second
(tokens in the rows written: what the target counts), rows, trainer sequences saved, file size, and
the child's peak RSS (VmHWM).
`--db PATH` keeps the store there and reuses it when it already holds the requested size. `--formats
jsonl,slime` runs only those formats' exports (`read` names the two read runs), side by side as in a full run.

Prompt phase. One episode grows from 1 to 128 turns through the T2 index (polarproxy/render/prefix.py)
with the tiny model's tokenizer and chat template: each turn is a tool call (~40 sampled tokens) and a tool
result (~25 tokens). The cost of building each turn's prompt is the median of repeated builds; reported at
turns 1 (rendered fresh: nothing to extend), 2, 32 and 128, with the ratio turn 128 / turn 1, and beside
it the cost of rendering the turn-128 conversation fresh (what a system that re-tokenizes pays).

`make bench` runs the export phase a second time at the size of a rollout fleet's
trajectories: 250 episodes x 30 calls growing to 32,768 tokens (`--episodes 250 --context 32768
--no-prompts`), about as many recorded tokens as the default store, in 4x fewer, longer calls. A call's
fixed cost (its row, its place in the merge) weighs 4x less per written token there.

The trainer formats (`--format slime|verl|trl|nemo-rl|openrlhf`, prefix-merged, `--advantages none`: the
bench store has no rewards) run last, each through `run_export` as the command does; slime writes one file
per 10 groups (`{rollout_id}` in the path). nemo-rl's `rollout_details` repeat each turn's whole prompt
(the RolloutDetail shape), so it writes more tokens than it reads: its rate counts the tokens of the rows.

Targets: >= 10 M written tokens/s for every strategy and format, memory flat in the store's size;
prompt construction at turn 128 within 2x of turn 1.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TINY_DIR = REPO / ".cache" / "bench-tiny"
PATHS = ("plain", "arrays", "jobs2")  # jobs2: the array path from two processes (`export --jobs 2`)
RUNS = (
    ("read", "none", "plain"),
    ("read", "none", "arrays"),
    *(
        (strategy, fmt, path)
        for strategy in ("per-request", "prefix-merge")
        for fmt in ("jsonl", "parquet")
        for path in PATHS
    ),
    # each trainer's own format (export/trainers/), prefix-merged as those formats default, by `run_export`
    *(("prefix-merge", fmt, "arrays") for fmt in ("slime", "verl", "trl", "nemo-rl", "openrlhf")),
)
TRAINER_FORMATS = ("slime", "verl", "trl", "nemo-rl", "openrlhf")
TARGET_TOKENS_PER_S = 10e6
TARGET_PROMPT_RATIO = 2.0
VOCAB = 150_000


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- the synthetic store -----------------------------------------------------------------------------


def build_store(db: Path, episodes: int, calls: int, context: int, seed: int = 0) -> dict[str, Any]:
    """Write `episodes` linear episodes of `calls` calls whose last call's prompt + output is ~`context`."""
    import numpy as np

    from polarproxy.store import CallResult, CallStart, EpisodeStart, Store

    growth = max(2, context // calls)
    out_len = max(1, growth // 4)
    tail_len = growth - out_len
    rng = np.random.default_rng(seed)
    conv = {"messages": [{"role": "user", "content": "go", "tool_calls": []}], "tools": [], "sampling": {}}
    t0 = time.perf_counter()
    store = Store.open(db)
    try:
        for first in range(0, episodes, 10):
            # Call k of 10 episodes per transaction, begun and then finished in two group commits, as the
            # proxy's writer commits them: each call is committed before the next call of its episode
            # begins, so the store keeps its prompt as a reference to the call before (linear storage).
            with store.batch():
                group = [
                    store.create_episode(EpisodeStart(command=["bench"], harness="bench"))
                    for _ in range(first, min(first + 10, episodes))
                ]
            prompts = [rng.integers(0, VOCAB, tail_len, dtype=np.int32).tolist() for _ in group]
            prev: list[str | None] = [None] * len(group)
            for _ in range(calls):
                with store.batch():
                    started = [
                        store.begin_call(
                            CallStart(
                                episode_id=eid,
                                dialect="openai_chat",
                                method="POST",
                                path="/v1/chat/completions",
                                model="bench",
                                stream=True,
                                request_headers={},
                                request_body="{}",
                                conversation=conv,
                                prompt_ids=prompts[i],
                                backend_kind="sglang",
                                render_mode="extended" if prev[i] else "fresh",
                                extended_from=prev[i],
                            )
                        )[0]
                        for i, eid in enumerate(group)
                    ]
                with store.batch():
                    for i, call_id in enumerate(started):
                        output = rng.integers(0, VOCAB, out_len, dtype=np.int32).tolist()
                        logprobs = (-rng.random(out_len, dtype=np.float32)).tolist()
                        store.finish_call(
                            call_id,
                            CallResult(
                                status="ok",
                                output_ids=output,
                                output_logprobs=logprobs,
                                completion={"text": "x", "reasoning": None, "tool_calls": []},
                                finish_reason="stop",
                                weight_version="w0",
                            ),
                        )
                        tail = rng.integers(0, VOCAB, tail_len, dtype=np.int32).tolist()
                        prompts[i] = prompts[i] + output + tail
                        prev[i] = call_id
    finally:
        store.close()
    size = sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))
    return {"seconds": round(time.perf_counter() - t0, 2), "db_mb": round(size / 2**20, 1)}


def _store_shape(db: Path) -> tuple[int, int] | None:
    from polarproxy.store import Store

    if not db.exists():
        return None
    store = Store.open(db)
    try:
        eps = store.list_episodes(limit=None)
        return len(eps), sum(e.calls for e in eps)
    finally:
        store.close()


# -- one export in a child process --------------------------------------------------------------------


def peak_rss_mb() -> float:
    """This process's peak resident memory: VmHWM (reset by exec, unlike ru_maxrss, which a child keeps
    from the parent it was forked from)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_one(strategy: str, fmt: str, path: str, db: str, out: str, profile: str | None) -> dict[str, Any]:
    """Open the store, reconstruct and write (as `polarproxy export` does, by the plain or the array path);
    time it, report peak RSS."""
    from polarproxy.export.rows import ExportStats
    from polarproxy.export.writers import get_writer
    from polarproxy.reconstruct import get_strategy
    from polarproxy.store import Store
    from polarproxy.store.token_calls import iter_token_calls

    store = Store.open(db)
    if fmt in TRAINER_FORMATS:
        return _run_trainer_format(store, strategy, fmt, out, profile)
    if strategy != "read":
        reconstruct, write = get_strategy(strategy), get_writer(fmt)
        if fmt == "parquet":  # one-time imports before the clock starts (pyarrow pulls in pandas lazily)
            import numpy as np
            import pyarrow as pa
            import pyarrow.parquet

            pa.array(np.zeros(1, np.float32), mask=np.zeros(1, np.bool_))
    rss_before = peak_rss_mb()
    prof = cProfile.Profile() if profile else None
    jobs = 1
    t0, cpu0, children0 = time.perf_counter(), time.process_time(), _children_cpu()
    if prof:
        prof.enable()
    episodes = {e.id: e for e in store.list_episodes(limit=None, counts=False)}
    if strategy == "read":
        stats = ExportStats()
        if path == "plain":
            for call in store.iter_calls():
                stats.calls += 1
                stats.per_request_tokens += len(call.prompt_ids) + len(call.output_ids)
        else:
            for tc in iter_token_calls(store):
                stats.calls += 1
                stats.per_request_tokens += len(tc.full_ids())
    elif path == "jobs2":  # the export command's own path, its workers forked from this process
        from polarproxy.export.run import run_export

        summary = run_export(store, out, fmt=fmt, strategy=strategy, jobs=2)
        jobs = summary["jobs"]  # 1 for a store under 2 x MIN_CALLS_PER_JOB calls (a --quick run)
        stats = ExportStats(
            **{k: summary[k] for k in ExportStats.__dataclass_fields__ if k not in ("sampling", "files")}
        )
        for d in summary["sampling"]:  # listed in the summary, counted in the stats
            stats.sampling[(d["temperature"], d["top_p"], d["top_k"], d["logprob_temperature"])] = d["calls"]
    else:  # as export/run.py reads them
        if path == "plain":
            calls: Any = store.iter_calls(lazy_prompts=strategy == "prefix-merge")
        else:
            calls = iter_token_calls(store)
        stats = write(reconstruct(calls, episodes=episodes), out)
    seconds = time.perf_counter() - t0
    # CPU of this process and of the workers it waited for (jobs2), so CPU figures compare across paths
    cpu_seconds = time.process_time() - cpu0 + _children_cpu() - children0
    if prof:
        prof.disable()
        print_profile(prof)
    store.close()
    return {
        "strategy": strategy,
        "format": fmt,
        "path": path,
        "jobs": jobs,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "stats": stats.summary(),
        "file_bytes": os.path.getsize(out) if os.path.exists(out) else None,
        "rss_before_mb": rss_before,
        "peak_rss_mb": peak_rss_mb(),
        "workers_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
    }


def print_profile(prof: cProfile.Profile) -> None:
    stats_out = pstats.Stats(prof, stream=sys.stderr)
    stats_out.sort_stats("cumulative").print_stats(25)
    stats_out.sort_stats("tottime").print_stats(25)  # where the time is spent, not only under what


def _run_trainer_format(store: Any, strategy: str, fmt: str, out: str, profile: str | None) -> dict[str, Any]:
    """A trainer format as `polarproxy export --format FMT --advantages none` writes it (slime: one file per
    10 groups, `{rollout_id}` in the path, so memory stays flat); timed as run_one times the others."""
    from polarproxy.export.advantages import AdvantageOptions
    from polarproxy.export.rows import ExportStats
    from polarproxy.export.run import run_export

    if fmt == "slime":
        import torch  # one-time import before the clock starts

        del torch
        os.makedirs(out, exist_ok=True)
        target = os.path.join(out, "{rollout_id}.pt")
    else:
        import pyarrow.parquet  # noqa: F401  (verl's writer; imported before the clock starts)

        target = out
    rss_before = peak_rss_mb()
    prof = cProfile.Profile() if profile else None
    t0, cpu0 = time.perf_counter(), time.process_time()
    if prof:
        prof.enable()
    summary = run_export(
        store,
        target,
        fmt=fmt,
        strategy=strategy,
        advantages=AdvantageOptions("none"),
        groups_per_file=10 if fmt == "slime" else None,
    )
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    if prof:
        prof.disable()
        print_profile(prof)
    store.close()
    stats = ExportStats(
        **{k: summary[k] for k in ExportStats.__dataclass_fields__ if k not in ("sampling", "files")}
    )
    files = summary.get("files") or [out]
    return {
        "strategy": strategy,
        "format": fmt,
        "path": "arrays",
        "jobs": 1,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "stats": stats.summary(),
        "file_bytes": sum(os.path.getsize(f) for f in files),
        "rss_before_mb": rss_before,
        "peak_rss_mb": peak_rss_mb(),
        "workers_peak_rss_mb": None,
    }


def export_phase(
    db: Path, tmp: Path, profile: str | None, formats: set[str] | None = None
) -> list[dict[str, Any]]:
    results = []
    for strategy, fmt, path in RUNS:
        if formats is not None and (strategy if fmt == "none" else fmt) not in formats:
            continue
        out = tmp / f"out.{strategy}.{fmt}.{path}"
        want = profile == f"{strategy}:{fmt}:{path}"
        cmd = [sys.executable, __file__, "--child", strategy, fmt, path, str(db), str(out)]
        proc = subprocess.run(
            cmd + (["--profile", profile] if want else []), capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{strategy} {fmt} failed:\n{proc.stderr[-3000:]}")
        if want:
            log(proc.stderr)
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        s = r["stats"]
        r["recorded_tokens_per_s"] = s["per_request_tokens"] / r["seconds"]
        r["recorded_tokens_per_cpu_s"] = s["per_request_tokens"] / r["cpu_seconds"]
        written = strategy != "read"
        r["exported_tokens_per_s"] = s["total_tokens"] / r["seconds"] if written else None
        r["exported_tokens_per_cpu_s"] = s["total_tokens"] / r["cpu_seconds"] if written else None
        results.append(r)
        log(
            f"  {strategy:>12} {fmt:<7} {path:<6} {r['seconds']:7.2f} s  "
            f"{r['recorded_tokens_per_s'] / 1e6:6.2f} M rec tok/s"
        )
        if out.is_dir():
            shutil.rmtree(out)
        elif out.exists():
            out.unlink()
        # The next run starts with no writeback of this one's output pending: a per-request JSONL file is
        # 1.6 GB, which the kernel would otherwise flush while the next export runs. Each run's own writing
        # is in its time, as before.
        os.sync()
    return results


# -- prompt construction as an episode grows -----------------------------------------------------------


def tiny_model() -> Path:
    """The random-weight tiny model (only its tokenizer and template matter), built once under .cache."""
    if (TINY_DIR / "tokenizer.json").is_file() and (TINY_DIR / "config.json").is_file():
        return TINY_DIR
    TINY_DIR.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=TINY_DIR.parent, prefix=".bench-tiny-"))
    log("bench: building the tiny model (random weights, ~10 s) ...")
    subprocess.run(
        [sys.executable, "-m", "polarproxy", "tiny-model", str(tmp / "m"), "--train-steps", "0"],
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        os.rename(tmp / "m", TINY_DIR)
    except OSError:
        pass  # another run got there first
    return TINY_DIR


def _median_seconds(fn: Any, repeats: int, clock: Any = time.perf_counter) -> float:
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return statistics.median(times)


def prompt_phase(turns: int, repeats: int, model: Path | None) -> dict[str, Any]:
    from array import array

    from polarproxy.conversation import Completion, Conversation, Message, Tool, ToolCall
    from polarproxy.render.prefix import PrefixIndex, Turn
    from polarproxy.render.renderer import Renderer

    r = Renderer(model or tiny_model())
    index = PrefixIndex(r)
    end = r.tokenizer.convert_tokens_to_ids("<|im_end|>")
    tools = [Tool(name="run", description="Run a shell command.", parameters={"type": "object"})]
    conv = Conversation(
        messages=[
            Message(role="system", content="You are a careful coding agent. Use the tools."),
            Message(role="user", content="Find the failing test in this repository and fix it."),
        ],
        tools=tools,
    )
    per_turn: dict[int, float] = {}
    per_turn_cpu: dict[int, float] = {}  # this thread's CPU time: less disturbed by other processes
    modes: dict[int, str] = {}
    context: dict[int, int] = {}
    for turn in range(1, turns + 1):
        per_turn[turn] = _median_seconds(lambda c=conv: index.build("ep", c), repeats)
        per_turn_cpu[turn] = _median_seconds(lambda c=conv: index.build("ep", c), repeats, time.thread_time)
        prompt = index.build("ep", conv)
        modes[turn], context[turn] = prompt.mode, len(prompt.ids)
        args = json.dumps({"command": f"pytest tests/test_module_{turn}.py -x -q --maxfail 1"})
        call = ToolCall(f"call_{turn:04d}", "run", args)
        sampled = f'<tool_call>\n{{"name": "run", "arguments": {args}}}\n</tool_call>'
        output = [*r.encode(sampled), end]
        index.remember(
            "ep",
            Turn(
                f"c{turn}",
                conv,
                Completion(tool_calls=[call], finish_reason="tool_calls"),
                prompt.tokens,
                array("i", output),
                "<|im_end|>",
            ),
        )
        result = f"collected 12 items; test_{turn} failed at line {turn * 7}: assert 3 == 4 (module {turn})"
        conv = Conversation(
            messages=[
                *conv.messages,
                Message(role="assistant", tool_calls=[call]),
                Message(role="tool", content=result, tool_call_id=call.id),
            ],
            tools=tools,
        )
    fresh_last = _median_seconds(lambda: r.render(conv), repeats)
    marks = sorted({t for t in (1, 2, 32, 128) if t <= turns} | {turns})
    return {
        "turns": turns,
        "repeats": repeats,
        "per_turn_ms": {t: per_turn[t] * 1e3 for t in marks},
        "per_turn_cpu_ms": {t: per_turn_cpu[t] * 1e3 for t in marks},
        "mode": {t: modes[t] for t in marks},
        "context_tokens": {t: context[t] for t in marks},
        "ratio_last_to_turn1": per_turn[turns] / per_turn[1],
        "cpu_ratio_last_to_turn1": per_turn_cpu[turns] / per_turn_cpu[1],
        "ratio_last_to_turn2": per_turn[turns] / per_turn[2] if turns >= 2 else None,
        "fresh_render_last_ms": fresh_last * 1e3,
    }


# -- main ---------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run (20 x 8 calls, 1k)")
    ap.add_argument("--episodes", type=int)
    ap.add_argument("--calls", type=int)
    ap.add_argument("--context", type=int)
    ap.add_argument("--turns", type=int, help="prompt phase: turns (default 128, --quick 32)")
    ap.add_argument("--no-prompts", action="store_true", help="the export phase only")
    ap.add_argument("--db", type=Path, help="keep the synthetic store here (reused if it has the size)")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument(
        "--model", type=Path, help="prompt phase: a model folder (default: the random tiny model)"
    )
    ap.add_argument("--profile", help="cProfile one run, e.g. prefix-merge:jsonl:arrays (printed to stderr)")
    ap.add_argument(
        "--formats", help="run only these formats' exports, e.g. jsonl,slime,nemo-rl (read: the read runs)"
    )
    ap.add_argument(
        "--child", nargs=5, metavar=("STRATEGY", "FORMAT", "PATH", "DB", "OUT"), help=argparse.SUPPRESS
    )
    a = ap.parse_args()
    formats = set(a.formats.split(",")) if a.formats else None
    known = {"read", "jsonl", "parquet", *TRAINER_FORMATS}
    if formats is not None and not formats <= known:
        ap.error(
            f"unknown format(s) {', '.join(map(repr, sorted(formats - known)))} in --formats. "
            f"Must be among {', '.join(map(repr, sorted(known)))}."
        )
    if a.child:
        print(json.dumps(run_one(*a.child, profile=a.profile)))
        return 0

    episodes = a.episodes or (20 if a.quick else 1000)
    calls = a.calls or (8 if a.quick else 30)
    context = a.context or (1024 if a.quick else 8192)
    turns = a.turns or (32 if a.quick else 128)
    with tempfile.TemporaryDirectory(prefix="pp-export-bench-") as tmp_name:
        tmp = Path(tmp_name)
        db = a.db or tmp / "bench.db"
        shape = _store_shape(db)
        if shape == (episodes, episodes * calls):
            log(f"bench: reusing {db} ({episodes} episodes x {calls} calls)")
            build = {"reused": True}
        else:
            if shape is not None:
                raise SystemExit(
                    f"Error: {db} holds {shape[0]} episodes, {shape[1]} calls; pass another --db."
                )
            log(f"bench: writing {episodes} episodes x {calls} calls, context {context} to {db} ...")
            build = build_store(db, episodes, calls, context)
            log(f"  {build['seconds']} s, {build['db_mb']} MB")
        log("bench: exports (each in a fresh process) ...")
        runs = export_phase(db, tmp, a.profile, formats)
    prompts = None
    if not a.no_prompts:
        log(f"bench: prompt construction over {turns} turns ...")
        prompts = prompt_phase(turns, repeats=5 if a.quick else 15, model=a.model)

    report = {
        "size": {"episodes": episodes, "calls_per_episode": calls, "context_tokens": context},
        "build": build,
        "exports": runs,
        "prompts": prompts,
        "targets": {"tokens_per_s": TARGET_TOKENS_PER_S, "prompt_ratio": TARGET_PROMPT_RATIO},
        "cpus": os.cpu_count(),
    }
    print_table(report)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _mb(n: int | None) -> str:
    return f"{n / 2**20:.1f}" if n is not None else "-"


def print_table(report: dict[str, Any]) -> None:
    size = report["size"]
    print(
        f"\nExport: {size['episodes']} episodes x {size['calls_per_episode']} calls, context up to "
        f"{size['context_tokens']} tokens (target >= {TARGET_TOKENS_PER_S / 1e6:.0f} M written tokens/s)"
    )
    head = (
        f"{'run':<30}{'s':>8}{'cpu s':>8}{'rec Mtok/s':>12}{'wr Mtok/s':>11}{'wr Mtok/cpu-s':>15}"
        f"{'rows':>9}{'seq ratio':>10}{'MB':>8}{'peak MB':>9}"
    )
    print(head)
    for r in report["exports"]:
        s = r["stats"]
        exp = f"{r['exported_tokens_per_s'] / 1e6:.2f}" if r["exported_tokens_per_s"] else "-"
        exp_cpu = f"{r['exported_tokens_per_cpu_s'] / 1e6:.2f}" if r["exported_tokens_per_cpu_s"] else "-"
        ratio = f"{s['sequence_ratio']:.1f}" if s["sequence_ratio"] else "-"
        name = f"{r['strategy']} {r['format']} {r['path']}".replace(" none", "")
        if r["path"] == "jobs2" and r.get("jobs") != 2:
            name += f" (ran as {r.get('jobs')})"
        print(
            f"{name:<30}{r['seconds']:>8.2f}{r['cpu_seconds']:>8.2f}"
            f"{r['recorded_tokens_per_s'] / 1e6:>12.2f}{exp:>11}{exp_cpu:>15}"
            f"{s['rows']:>9}{ratio:>10}{_mb(r['file_bytes']):>8}"
            f"{max(r['peak_rss_mb'], r.get('workers_peak_rss_mb') or 0):>9}"
        )
    p = report["prompts"]
    if p is None:
        return
    print(f"\nPrompt construction (T2 index), median of {p['repeats']} builds per turn (wall, thread CPU):")
    for t, ms in p["per_turn_ms"].items():
        cpu = p["per_turn_cpu_ms"][t]
        print(f"  turn {t:>3}: {ms:7.3f} ms {cpu:7.3f} ms  ({p['mode'][t]}, {p['context_tokens'][t]} tokens)")
    print(
        f"  turn {p['turns']} / turn 1 = {p['ratio_last_to_turn1']:.2f}x wall, "
        f"{p['cpu_ratio_last_to_turn1']:.2f}x CPU (target <= {TARGET_PROMPT_RATIO:.0f}x); "
        f"rendering turn {p['turns']} fresh instead: {p['fresh_render_last_ms']:.3f} ms"
    )


if __name__ == "__main__":
    sys.exit(main())
