"""What `polarproxy record` costs before and around the harness: `record -- true`, and the first answered call.

    python bench/record_startup.py [--rounds N] [--json OUT]

One fixed-answer backend double (bench/stub_server.py, answering at once) serves every run. Each round
runs, in a new shuffled order:

- **python**: `python -c pass`, the interpreter's own start, the floor under any Python CLI;
- **true**: `polarproxy record --backend STUB --model M --db TMP -- true`, start to exit: the whole fixed
  cost of a recording (imports, the store, the backend check, mitmproxy, the harness, the summary; the
  tokenizer loads in the background once the proxy listens, and `true` makes no call that waits for it);
- **first call**: `record -- python client.py`, where the client makes one chat call through the proxy
  and writes down when its answer came; the figure is launch to that answer. The client's own start is
  measured apart (`client alone`, against the stub directly) and shown beside it. The model folder's
  tokenizer snapshot (render/snapshot.py) is there, as it is from a folder's second use on;
- **first call, cold**: the same with `POLARPROXY_TOKENIZER_CACHE=0`, as at a folder's first use:
  transformers reads the folder (its import alone is ~1.2 s).

Each figure is the median over the rounds (wall time; the machine's noise hits all alike). The issue's
goal is `record -- true` within 0.5 s; the JSON has every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import proxy_overhead as po  # the shared stub, tiny model and process helpers

GOAL_TRUE_S = 0.5
CLIENT = """\
import os, sys, time, urllib.request, json
t0 = time.time()
body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}).encode()
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions", body,
                             {"content-type": "application/json"})
with urllib.request.urlopen(req, timeout=30) as r:
    assert r.status == 200, r.status
    json.loads(r.read())
open(sys.argv[1], "w").write(repr(time.time()))
"""


def run_timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=env, timeout=120)
    dt = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:4]}... exited {done.returncode}:\n{done.stderr.decode()[-2000:]}")
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--json", type=Path, help="Write every figure and sample here.")
    args = ap.parse_args()

    model = po.tiny_model()
    work = Path(tempfile.mkdtemp(prefix="pp-startup-"))
    os.environ["POLARPROXY_CACHE_DIR"] = str(work / "cache")  # its tokenizer snapshot, made just below
    from polarproxy.render.renderer import Renderer

    renderer = Renderer(model)
    ids = [*renderer.encode(po.TEXT), renderer.stop_token_ids[0]]
    stub, stub_url = po.spawn(
        "stub",
        [
            sys.executable,
            str(po.REPO / "bench" / "stub_server.py"),
            "--output-ids",
            json.dumps(ids),
            "--text",
            po.TEXT,
            "--first-token-ms",
            "0",
            "--per-token-ms",
            "0",
        ],
        po.re.compile(r"listening on (http://[\d.]+:\d+)"),
        timeout=30,
    )
    client = work / "client.py"
    client.write_text(CLIENT)
    # As installed packages are: with their bytecode compiled (pip compiles on install; an editable install
    # writes it at the first import). A PYTHONDONTWRITEBYTECODE in the environment (this workplace sets it)
    # would have every run compile polarproxy's ~90 modules again: ~0.28 s of `record`'s import time.
    env = {k: v for k, v in po.SUB_ENV.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["POLARPROXY_CACHE_DIR"] = os.environ["POLARPROXY_CACHE_DIR"]
    record = [sys.executable, "-m", "polarproxy", "record", "--backend", stub_url, "--model", str(model)]
    samples: dict[str, list[float]] = {
        "python": [],
        "true": [],
        "first_call": [],
        "first_call_cold": [],
        "client_alone": [],
    }
    load_before = os.getloadavg()
    try:
        rng = random.Random(0)
        for i in range(args.rounds + 1):  # round 0 warms the page and bytecode caches and is not counted
            order = list(samples)
            rng.shuffle(order)
            got: dict[str, float] = {}
            for case in order:
                db = work / f"r{i}-{case}.db"
                stamp = work / f"stamp-{i}-{case}"
                if case == "python":
                    got[case] = run_timed([sys.executable, "-c", "pass"], env)
                elif case == "true":
                    got[case] = run_timed([*record, "--db", str(db), "--", "true"], env)
                elif case in ("first_call", "first_call_cold"):
                    cold = {"POLARPROXY_TOKENIZER_CACHE": "0"} if case == "first_call_cold" else {}
                    t0 = time.time()
                    run_timed(
                        [*record, "--db", str(db), "--", sys.executable, str(client), str(stamp)],
                        {**env, **cold},
                    )
                    got[case] = float(stamp.read_text()) - t0
                else:
                    t0 = time.time()
                    run_timed(
                        [sys.executable, str(client), str(stamp)],
                        {**env, "OPENAI_BASE_URL": stub_url + "/v1"},
                    )
                    got[case] = float(stamp.read_text()) - t0
            if i:
                for k, v in got.items():
                    samples[k].append(round(v, 4))
            po.log(f"round {i}: " + ", ".join(f"{k} {v:.3f} s" for k, v in sorted(got.items())))
    finally:
        stub.stop()
    med = {k: round(statistics.median(v), 3) for k, v in samples.items()}
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": {"cpus": os.cpu_count(), "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "rounds": args.rounds,
        "median_s": med,
        "samples_s": samples,
        "record_true_over_python_s": round(med["true"] - med["python"], 3),
        "first_call_over_client_s": round(med["first_call"] - med["client_alone"], 3),
        "goals": {
            "record_true_s": {
                "value": med["true"],
                "goal": f"<= {GOAL_TRUE_S:g}",
                "met": med["true"] <= GOAL_TRUE_S,
            }
        },
    }
    print(
        f"record start-up, {result['date']}, {args.rounds} rounds, load {load_before[0]:.1f} -> "
        f"{result['host']['loadavg_after'][0]:.1f} (medians)\n"
        f"  python -c pass                   {med['python']:.3f} s\n"
        f"  record -- true                   {med['true']:.3f} s  (goal <= {GOAL_TRUE_S:g} s: "
        f"{'met' if result['goals']['record_true_s']['met'] else 'MISSED'})\n"
        f"  record -- client, first answer   {med['first_call']:.3f} s after launch\n"
        f"    the same, folder's first use   {med['first_call_cold']:.3f} s after launch\n"
        f"  client alone, first answer       {med['client_alone']:.3f} s after launch"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
        po.log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
