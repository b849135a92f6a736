"""A small coding agent for `polarproxy rollout -- python examples/swe/agent.py [--tool NAME]`.

It reads the task from stdin (or $POLARPROXY_INSTRUCTION), talks OpenAI Chat Completions to
$OPENAI_BASE_URL with $OPENAI_API_KEY (the episode's gateway and key, which `rollout` sets), offers one
shell tool and runs what the model asks in its working folder (the episode's workspace), until the model
answers without a tool call. The tool is named `run_shell_command` (as Qwen Code's and Gemini CLI's are),
or `--tool NAME` (`Bash`: as Claude Code's; `exec_command`: as Codex's, whose argument is `cmd`), so that
one scripted policy (examples/swe/policy.yaml) can play a different hand per "harness". Exits 0 when the
model gave a final answer, 1 when it did not within MAX_TURNS.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx

MAX_TURNS = 8
ARGUMENT = {"exec_command": "cmd"}  # each tool's argument for the command line (default: `command`)


def tool_definition(name: str) -> dict:
    arg = ARGUMENT.get(name, "command")
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": "Run a shell command in the repository and return its output.",
            "parameters": {"type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]},
        },
    }


def run(command: str) -> str:
    try:
        done = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "timed out after 60 s"
    return (done.stdout + done.stderr)[-4000:] + f"\n(exit {done.returncode})"


def main() -> int:
    args = sys.argv[1:]
    tool = args[args.index("--tool") + 1] if "--tool" in args else "run_shell_command"
    instruction = sys.stdin.read().strip() or os.environ.get("POLARPROXY_INSTRUCTION", "")
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    key = os.environ.get("OPENAI_API_KEY", "none")
    messages: list[dict] = [
        {
            "role": "system",
            "content": "You fix bugs in the repository in your working folder with the shell tool.",
        },
        {"role": "user", "content": instruction},
    ]
    with httpx.Client(headers={"authorization": f"Bearer {key}"}, timeout=300) as client:
        for _ in range(MAX_TURNS):
            body = {
                "model": "default",
                "messages": messages,
                "tools": [tool_definition(tool)],
                "max_tokens": 256,
            }
            r = client.post(base + "/chat/completions", json=body)
            if r.status_code != 200:
                print(f"model call failed: HTTP {r.status_code}: {r.text[:500]}", file=sys.stderr)
                return 1
            reply = r.json()["choices"][0]["message"]
            messages.append({k: v for k, v in reply.items() if k in ("role", "content", "tool_calls")})
            calls = reply.get("tool_calls") or []
            if not calls:
                print(json.dumps({"final": reply.get("content")}))
                return 0
            for call in calls:
                try:
                    arguments = json.loads(call["function"]["arguments"] or "{}")
                except ValueError:
                    arguments = {}
                command = str(arguments.get(ARGUMENT.get(tool, "command"), ""))
                print(json.dumps({"tool": call["function"]["name"], "command": command}), flush=True)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": run(command)})
    print(json.dumps({"error": f"no final answer after {MAX_TURNS} turns"}))
    return 1


if __name__ == "__main__":
    sys.exit(main())
