"""The toy RL task's verifier: reward 1.0 when the agent's reply starts with a letter from a to m.

A random tiny model starts near the share of its vocabulary that does (about a third), so the reward has
room to rise and GRPO groups have variance. The verifier runs inside the agent's environment and posts the
reward to the proxy (`POST $POLARPROXY_URL/polarproxy/v1/episodes/$POLARPROXY_EPISODE/reward`), as a
verifier inside a sandbox would; it also prints the reward (the `--reward-from stdout` form of `record`).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

LETTERS = set("abcdefghijklm")


def reward_of(reply: str) -> float:
    text = reply.strip()
    return 1.0 if text and text[0] in LETTERS else 0.0


def main() -> int:
    answer = Path("answer.txt")
    reply = answer.read_text() if answer.is_file() else ""
    reward = reward_of(reply)
    url = os.environ.get("POLARPROXY_URL")
    if url:
        episode = os.environ["POLARPROXY_EPISODE"]
        req = urllib.request.Request(
            f"{url}/polarproxy/v1/episodes/{episode}/reward",
            data=json.dumps({"reward": reward}).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read()
    print(reward)
    return 0


if __name__ == "__main__":
    sys.exit(main())
