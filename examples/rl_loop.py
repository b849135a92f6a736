"""`make demo-rl`: the RL loop closed on a CPU, record -> reward -> export -> train -> sync -> record.

Every iteration runs `--tasks` toy tasks x `--samples` samples (the GRPO groups) through the real proxy
(`polarproxy serve`, one episode per sample, the agent an unmodified HTTP client of the Chat Completions
API), lets each sample's verifier post its reward to the proxy, exports the iteration's episodes with
`polarproxy export --advantages grpo`, trains on them with `polarproxy train`, which pushes the new
checkpoint to the backend (`--sync`, SGLang's `/update_weights_from_disk`), and goes on with the new
weights. The mean reward per iteration is printed, written as JSON (`--json`) and drawn as a PNG.

The toy task (examples/rl/): reply with a word that starts with a letter from a to m. A random tiny model
starts near a third; the reward rises as GRPO pushes up the tokens that earn it. With `--lr 0` the weights
never change and, since every sample keeps its sampling seed across iterations, neither does the reward.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RL = REPO / "examples" / "rl"
CLI = [sys.executable, "-m", "polarproxy"]
PROMPTS = [
    "Say one word.",
    "Name a thing.",
    "Reply with a word.",
    "Pick a word.",
    "Give me a word.",
    "One word, please.",
    "Tell me a word.",
    "Write a word.",
]


def say(msg: str) -> None:
    print(f"==> {msg}", flush=True)


def start(cmd: list[str], pattern: str) -> tuple[subprocess.Popen[str], str]:
    """Start a server process and return it with the URL its stderr announces."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        m = re.search(pattern, line)
        if m:
            return proc, m.group(1)
    raise SystemExit(f"{cmd[3]} did not start (exit {proc.wait()})")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.load(r)


def run_sample(serve_url: str, episode_id: str, prompt: str, seed: int, work: Path) -> None:
    """One sample: the agent, then the verifier, in their own workspace, pointed at the episode."""
    work.mkdir(parents=True)
    env = {
        **os.environ,
        "OPENAI_BASE_URL": f"{serve_url}/e/{episode_id}/v1",
        "OPENAI_API_KEY": "polarproxy",
        "POLARPROXY_URL": serve_url,
        "POLARPROXY_EPISODE": episode_id,
    }
    subprocess.run(
        [sys.executable, str(RL / "toy_agent.py"), prompt, str(seed)], cwd=work, env=env, check=True
    )
    subprocess.run(
        [sys.executable, str(RL / "toy_verify.py")], cwd=work, env=env, check=True, stdout=subprocess.DEVNULL
    )


def iterate(args: argparse.Namespace, it: int, serve_url: str, scratch: Path) -> tuple[list[str], float]:
    """Sample every task's group once; the episodes and their mean reward."""
    from polarproxy.store import EpisodeStart
    from polarproxy.store.store import Store

    store = Store.open(args.db)
    jobs = []
    for t in range(args.tasks):
        for s in range(args.samples):
            start_ = EpisodeStart(
                command=["examples/rl/toy_agent.py"],
                task=f"toy-{t}",
                group_id=f"it{it}-toy-{t}",
                metadata={"iteration": str(it), "sample": str(s)},
            )
            jobs.append((store.create_episode(start_), PROMPTS[t % len(PROMPTS)], 1000 * t + s))
    with ThreadPoolExecutor(args.concurrency) as pool:
        futures = [
            pool.submit(run_sample, serve_url, eid, prompt, seed, scratch / f"it{it}" / eid)
            for eid, prompt, seed in jobs
        ]
        for f in futures:
            f.result()
    rewards = []
    for eid, _, _ in jobs:
        store.finish_episode(eid, status="ok", exit_code=0)
        reward = store.get_episode(eid).reward
        rewards.append(0.0 if reward is None else reward)
    store.close()
    return [eid for eid, _, _ in jobs], sum(rewards) / len(rewards)


def train(args: argparse.Namespace, it: int, episodes: list[str], backend_url: str, scratch: Path) -> dict:
    data = scratch / f"it{it}.jsonl"
    picks = [a for eid in episodes for a in ("--episode", eid)]
    exported = subprocess.run(
        [*CLI, "export", "--db", str(args.db), *picks, "--advantages", "grpo", "--out", str(data), "--json"],
        check=True,
        capture_output=True,
        text=True,
    )
    stats = json.loads(exported.stdout)
    if stats.get("rows", 0) == 0:  # every group's rewards were equal: nothing to learn from this round
        return {"rows": 0}
    cmd = [*CLI, "train", "--data", str(data), "--model", str(args.model), "--out", str(args.run)]
    cmd += ["--steps", str(args.steps), "--rows-per-step", str(args.rows_per_step), "--lr", str(args.lr)]
    cmd += ["--sync", backend_url, "--sync-kind", "local"]
    if (args.run / "metrics.jsonl").exists():
        cmd.append("--resume")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return {"rows": stats["rows"]}


def plot(curve: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot([c["iteration"] for c in curve], [c["reward_mean"] for c in curve], marker="o")
    ax.set_xlabel("iteration")
    ax.set_ylabel("mean reward")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "demo-rl-out")
    p.add_argument(
        "--model", type=Path, default=None, help="starting model folder (default: a random tiny model)"
    )
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--samples", type=int, default=8, help="samples per task (the GRPO group size)")
    p.add_argument("--steps", type=int, default=4, help="trainer steps per iteration")
    p.add_argument("--rows-per-step", type=int, default=16, help="rows per trainer step")
    p.add_argument("--lr", type=float, default=2e-2)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--json", type=Path, default=None, help="write the reward curve as JSON here")
    args = p.parse_args(argv)

    args.out.mkdir(parents=True, exist_ok=True)
    args.db = args.out / "rl.db"
    args.run = args.out / "run"
    for stale in [*args.out.glob("rl.db*")]:
        stale.unlink()
    if args.run.exists():
        import shutil

        shutil.rmtree(args.run)
    if args.model is None:
        args.model = REPO / ".cache" / "demo-rl-tiny"
        if not (args.model / "config.json").is_file():
            say("building a random tiny model (once)")
            subprocess.run([*CLI, "tiny-model", str(args.model), "--train-steps", "0", "--force"], check=True)
    say("starting the local backend and the recording gateway")
    backend, backend_url = start(
        [*CLI, "backend", "--model", str(args.model), "--port", "0", "--weight-version", "0"],
        r"on (http://[\d.]+:\d+)",
    )
    serve, serve_url = start(
        [
            *CLI,
            "serve",
            "--backend",
            backend_url,
            "--model",
            str(args.model),
            "--db",
            str(args.db),
            "--port",
            "0",
        ],
        r"recording on (http://[\d.]+:\d+)",
    )
    curve: list[dict] = []
    try:
        with tempfile.TemporaryDirectory(prefix="polarproxy-rl-") as tmp:
            scratch = Path(tmp)
            for it in range(args.iterations):
                t0 = time.perf_counter()
                version = get_json(f"{backend_url}/model_info").get("weight_version")
                episodes, mean = iterate(args, it, serve_url, scratch)
                point = {
                    "iteration": it,
                    "reward_mean": mean,
                    "samples": len(episodes),
                    "weight_version": version,
                }
                if it < args.iterations - 1:
                    point.update(train(args, it, episodes, backend_url, scratch))
                point["seconds"] = round(time.perf_counter() - t0, 1)
                curve.append(point)
                say(
                    f"iteration {it}: mean reward {mean:.3f} over {len(episodes)} samples (weights {version})"
                )
    finally:
        for proc in (serve, backend):
            proc.terminate()
            proc.wait(timeout=30)
    result = {"lr": args.lr, "tasks": args.tasks, "samples": args.samples, "curve": curve, "db": str(args.db)}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    png = args.out / "reward.png"
    plot(curve, png, f"GRPO on the toy task (lr {args.lr:g}, {args.tasks}x{args.samples} samples)")
    start_, end = curve[0]["reward_mean"], curve[-1]["reward_mean"]
    say(f"mean reward {start_:.3f} -> {end:.3f}; curve in {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
