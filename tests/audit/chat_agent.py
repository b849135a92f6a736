"""A multi-turn tool-calling chat harness for the audit tests: OpenAI Chat Completions (not streamed) to
$OPENAI_BASE_URL, the tiny model's tools (list_files, read_file) run over the current directory.

Each command-line argument is one user turn; after each, the agent runs tool calls until the model answers
without one. It sends the assistant turns back as it got them, `reasoning_content` included (as Qwen Code
does), so a template that drops earlier reasoning re-renders the history differently from what the model
saw. Prints one JSON line per model call.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx

from polarproxy.tiny.script import SYSTEM_PROMPT, TOOLS

MAX_CALLS = 12


def run_tool(name: str, arguments: str) -> str:
    path = Path(str(json.loads(arguments or "{}").get("path", ".")))
    if name == "list_files":
        return "\n".join(sorted(p.name for p in path.iterdir() if p.is_file()))
    if name == "read_file":
        return path.read_text() if path.is_file() else f"Error: no such file: {path}"
    return f"Error: unknown tool: {name}"


def main(prompts: list[str]) -> int:
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    key = os.environ.get("OPENAI_API_KEY", "none")
    messages: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT}]
    calls = 0
    with httpx.Client(headers={"authorization": f"Bearer {key}"}, timeout=300) as client:
        for prompt in prompts:
            messages.append({"role": "user", "content": prompt})
            while True:
                calls += 1
                if calls > MAX_CALLS:
                    print(json.dumps({"error": f"more than {MAX_CALLS} calls"}), flush=True)
                    return 1
                body = {"model": "tiny", "messages": messages, "tools": TOOLS, "max_tokens": 256}
                r = client.post(base + "/chat/completions", json=body)
                if r.status_code != 200:
                    print(json.dumps({"error": r.text}), flush=True)
                    return 1
                reply = r.json()["choices"][0]["message"]
                messages.append(reply)
                names = [c["function"]["name"] for c in reply.get("tool_calls") or []]
                print(json.dumps({"call": calls, "tool_calls": names}), flush=True)
                if not names:
                    break
                for c in reply["tool_calls"]:
                    result = run_tool(c["function"]["name"], c["function"]["arguments"])
                    messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
