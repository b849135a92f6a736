"""`make demo`: the whole path on the embedded default, offline, on a CPU.

1. build the tiny model (once; cached in .cache/demo-tiny),
2. start `polarproxy backend` over it,
3. `polarproxy record` the example tool-calling agent in a scratch workspace (one episode, 3 calls),
4. `polarproxy export --strategy per-request` to demo-out/calls.jsonl,
5. check every sampled token's recorded logprob against a teacher-forced forward pass, and summarise.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from demo_support import CLI, REPO, TINY, ensure_tiny, start_backend, step

OUT = REPO / "demo-out"
DB = OUT / "demo.db"


def main() -> int:
    OUT.mkdir(exist_ok=True)
    for f in OUT.glob("demo.db*"):
        f.unlink()
    tiny = ensure_tiny()
    step("starting the local backend")
    backend, url = start_backend("--max-new-tokens-limit", "256")
    try:
        with tempfile.TemporaryDirectory(prefix="polarproxy-demo-") as ws:
            Path(ws, "README.md").write_text("# Demo workspace\n\nA tiny project for the polarproxy demo.\n")
            Path(ws, "main.py").write_text('print("hello")\n')
            step("recording the example agent (python examples/tool_agent.py)")
            t0 = time.perf_counter()
            rec = subprocess.run(
                [
                    *CLI,
                    "record",
                    "--backend",
                    url,
                    "--model",
                    str(tiny),
                    "--db",
                    str(DB),
                    "--task",
                    "list-and-read",
                    "--json-out",
                    str(OUT / "record.json"),
                    "--",
                    sys.executable,
                    str(REPO / "examples" / "tool_agent.py"),
                ],
                cwd=ws,
                stdout=subprocess.PIPE,
                text=True,
            )
            print(rec.stdout, end="")
            summary = json.loads((OUT / "record.json").read_text())
            print(f"(recorded in {time.perf_counter() - t0:.1f} s)")
        step("exporting per-request rows")
        subprocess.run(
            [
                *CLI,
                "export",
                "--db",
                str(DB),
                "--strategy",
                "per-request",
                "--format",
                "jsonl",
                "--out",
                str(OUT / "calls.jsonl"),
            ],
            check=True,
        )
        step("the episode")
        subprocess.run([*CLI, "show", summary["episode_id"], "--db", str(DB)], check=True)
        step("checking recorded logprobs against a teacher-forced forward pass")
        worst = teacher_forced_check(OUT / "calls.jsonl")
        print(f"max |recorded - teacher-forced| over all sampled tokens: {worst:.2e}")
        ok = rec.returncode == 0 and summary["calls"] >= 3 and worst < 1e-4
        step("summary")
        print(
            f"episode {summary['episode_id']}: {summary['calls']} calls, {summary['tokens']} tokens, agent exit "
            f"{summary['exit_code']}; rows in {OUT / 'calls.jsonl'}; store {DB}"
        )
        print("demo OK" if ok else "demo FAILED")
        return 0 if ok else 1
    finally:
        backend.terminate()
        backend.wait(10)


def teacher_forced_check(rows_path: Path) -> float:
    from transformers.utils import logging as hf_logging

    from polarproxy.backends.local.model_runner import ModelRunner

    hf_logging.disable_progress_bar()

    runner = ModelRunner(TINY)
    worst = 0.0
    for line in rows_path.read_text().splitlines():
        row = json.loads(line)
        n_prompt = row["loss_mask"].index(1)
        prompt, output = row["input_ids"][:n_prompt], row["input_ids"][n_prompt:]
        scored = runner.score(prompt, output)
        recorded = row["logprobs"][n_prompt:]
        worst = max([worst, *(abs(a - b) for a, b in zip(scored, recorded, strict=True))])
    return worst


if __name__ == "__main__":
    sys.exit(main())
