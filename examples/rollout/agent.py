"""A minimal headless agent for `polarproxy rollout -- python examples/rollout/agent.py`.

It reads the task's instruction from stdin (or $POLARPROXY_INSTRUCTION), asks the model once through
the OpenAI Chat Completions API at $OPENAI_BASE_URL with $OPENAI_API_KEY (which `rollout` sets to the
episode's gateway and key), and writes the answer to answer.txt in its working folder (the episode's
workspace). Exits 0 when the model answered.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx


def main() -> int:
    instruction = sys.stdin.read().strip() or os.environ.get("POLARPROXY_INSTRUCTION", "")
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    key = os.environ.get("OPENAI_API_KEY", "none")
    files = sorted(str(p) for p in Path(".").rglob("*") if p.is_file())
    body = {
        "model": "default",
        "messages": [
            {"role": "system", "content": "You are a careful coding agent. Files: " + ", ".join(files)},
            {"role": "user", "content": instruction},
        ],
        "max_tokens": 64,
        "temperature": 1.0,
    }
    r = httpx.post(
        f"{base}/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=120
    )
    if r.status_code != 200:
        print(f"model call failed: HTTP {r.status_code}: {r.text[:500]}", file=sys.stderr)
        return 1
    answer = r.json()["choices"][0]["message"]["content"] or ""
    Path("answer.txt").write_text(answer + "\n")
    print(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
