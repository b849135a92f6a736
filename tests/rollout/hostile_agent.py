"""An agent that tries, per task, one route to its own reward or to the host (tests/rollout/
test_hostile_agents.py). It makes one model call first, so each episode is a sample of the policy."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx


def main() -> int:
    task = sys.stdin.read().strip()
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    key = os.environ["OPENAI_API_KEY"]
    auth = {"authorization": f"Bearer {key}"}
    r = httpx.post(
        f"{base}/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": task}], "max_tokens": 8},
        headers=auth,
        timeout=60,
    )
    r.raise_for_status()
    if (
        task == "self-reward"
    ):  # set its own reward with its own key, then make the evaluate copy hang on a FIFO
        url = f"{os.environ['POLARPROXY_URL']}/polarproxy/v1/episodes/{os.environ['POLARPROXY_EPISODE']}"
        Path("reward-status").write_text(
            str(httpx.post(f"{url}/reward", json={"reward": 1.0}, headers=auth).status_code)
        )
        httpx.post(f"{url}/finish", json={"exit_code": 0, "reward": 1.0}, headers=auth)
        os.mkfifo("answer.txt")
    elif task == "link-out":  # the answer is a link to a host file: grading must not read through it
        os.symlink(os.environ["HOST_SECRET_FILE"], "answer.txt")
    elif task == "import":  # the solution the verifier imports looks around the host when imported
        Path("solution.py").write_text(IMPORTED)
    elif task == "fork-bomb":  # as many processes as it can: the episode's process limit stops it
        import subprocess

        started = []
        try:
            for _ in range(200):
                started.append(subprocess.Popen(["sleep", "30"]))
        except OSError:
            pass
        Path("started.txt").write_text(str(len(started)))
        for p in started:
            p.kill()
    elif task == "memory-bomb":  # more memory than the episode has: killed, the limit named
        hog = bytearray(1 << 30)
        for i in range(0, len(hog), 4096):
            hog[i] = 1
    return 0


IMPORTED = """
import json, os, subprocess
seen = {p: os.path.exists(p) for p in os.environ.get("PROBE_ABSENT", "").split(os.pathsep) if p}
subprocess.Popen(["setsid", "sleep", "300"], stdout=1, stderr=2)  # detached: must not hold the grader
print(json.dumps({"seen": seen, "uid": os.getuid()}))
"""

if __name__ == "__main__":
    sys.exit(main())
