"""The toy RL task's agent: one chat call to whatever `OPENAI_BASE_URL` points at, its reply in answer.txt.

Stdlib only, so each of the many samples of an iteration starts in milliseconds. The prompt is argv[1];
the sampling seed argv[2] (the same seed every iteration, so with unchanged weights a sample is the same:
the `--lr 0` control of `examples/rl_loop.py` measures exactly zero change, not sampling noise).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request


def main() -> int:
    prompt, seed = sys.argv[1], int(sys.argv[2])
    body = {
        "model": os.environ.get("POLARPROXY_MODEL_NAME", "tiny"),
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 1,
        "temperature": 1.0,
        "seed": seed,
    }
    req = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "content-type": "application/json",
            "authorization": f"Bearer {os.environ.get('OPENAI_API_KEY', 'x')}",
        },
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        reply = json.load(r)["choices"][0]["message"].get("content") or ""
    with open("answer.txt", "w") as f:
        f.write(reply)
    return 0


if __name__ == "__main__":
    sys.exit(main())
