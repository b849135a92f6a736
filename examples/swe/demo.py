"""`make demo-swe`: the paper's experiment at laptop scale, offline, on a CPU.

1. make the example suite (examples/swe/suite.py: five SWE-bench-format instances and their repositories),
2. start `polarproxy backend --script examples/swe/policy.yaml` over the tiny model (the policy plays a
   different hand per harness: it resolves three instances under each, not the same three),
3. `polarproxy rollout` every instance under two real harness CLIs, Qwen Code and Claude Code
   (`--harness qwen --harness claude`, each episode in the bwrap sandbox, graded as SWE-bench grades),
4. `polarproxy compare`: per harness, the resolved rate, pass@k, tokens, calls; per task, who solved it
   (also written to demo-swe-out/compare.md).

The CLIs come from `make harnesses` (.cache/harnesses); the tests run the same suite with a scripted
`-- CMD` agent (tests/rollout/test_swe_suite.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: what the demos share
from demo_support import CLI, REPO, ensure_tiny, start_backend, step

OUT = REPO / "demo-swe-out"
BIN = REPO / ".cache" / "harnesses" / "node_modules" / ".bin"
HARNESSES = ("qwen", "claude")


def main() -> int:
    missing = [h for h in HARNESSES if shutil.which(h, path=str(BIN)) is None]
    if missing:
        raise SystemExit(f"Error: the harness CLIs {missing} are not in {BIN}. Run `make harnesses` first.")
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir()
    sys.path.insert(0, str(Path(__file__).parent))
    import suite

    step("making the five example instances")
    source = suite.build(OUT)
    tiny = ensure_tiny()
    step("starting the local backend with the scripted policy")
    backend, url = start_backend("--script", str(Path(__file__).parent / "policy.yaml"), echo=False)
    env = {
        **os.environ,
        # the CLIs, and this venv's python3 with pytest for the graders
        "PATH": os.pathsep.join([str(BIN), str(Path(sys.executable).parent), os.environ["PATH"]]),
        "NO_COLOR": "1",
    }
    db = OUT / "swe.db"
    try:
        step(f"rolling out {len(suite.INSTANCES)} instances under {' and '.join(HARNESSES)}")
        harness_args = [a for h in HARNESSES for a in ("--harness", h)]
        subprocess.run(
            [
                *CLI,
                "rollout",
                str(source),
                "--repos",
                str(OUT / "repos"),
                *harness_args,
                "--backend",
                url,
                "--model",
                str(tiny),
                "--db",
                str(db),
                "--rollout-id",
                "demo-swe",
                "--concurrency",
                "2",
            ],
            check=True,
            env=env,
        )
    finally:
        backend.terminate()
        backend.wait(30)
    step("comparing the harnesses")
    subprocess.run([*CLI, "compare", "--db", str(db), "--md", str(OUT / "compare.md")], check=True)
    print(
        f"\nstore {db}; `polarproxy show EPISODE --db {db}` shows each diff and its tests; `polarproxy view --db {db}`"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
