"""An agent whose samples fail in each way the failure taxonomy tells apart (export/failures.py), in the
order they run (one at a time): the first never reaches the model (a crash at start), the second crashes
after its first call, the third solves the task."""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path

import httpx


def turn() -> int:
    counter = Path(os.environ["TAXONOMY_COUNTER"])
    with open(counter, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        n = len(f.read())
        f.write("x")
    return n


def main() -> int:
    n = turn()
    if n == 0:
        return 2  # a wrong path, a missing binary: the model never saw this sample
    instruction = sys.stdin.read()
    r = httpx.post(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": instruction}], "max_tokens": 8},
        headers={"authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"},
        timeout=60,
    )
    r.raise_for_status()
    if n == 1:
        return 3  # the agent's own crash, after the model answered: a sample that solved nothing
    Path("answer.txt").write_text("Hello\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
