"""A small tool-calling agent: the kind of harness polarproxy records, in one file.

It speaks OpenAI Chat Completions with streaming to $OPENAI_BASE_URL (which `polarproxy record` sets),
offers two real tools over its workspace (list_files, read_file), runs them when the model asks, and
stops when the model answers without a tool call. The workspace is `--workspace DIR`, else the current
directory; run from the repository root (as the README does) it is `examples/workspace/`, so the model is
not shown the whole checkout. It knows nothing about polarproxy: only the tool
definitions and prompts come from the tiny model's script, so the tiny model plays along.

    polarproxy record --backend URL --model DIR -- python examples/tool_agent.py [--workspace DIR] [PROMPT]

Prints one JSON line per model call (what it streamed) and exits 0 when the model gave a final answer.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import httpx

from polarproxy.tiny.script import SYSTEM_PROMPT, TOOLS, USER_PROMPTS

MAX_TURNS = 6
HERE = Path(__file__).resolve().parent


def workspace(given: str | None) -> Path:
    """`--workspace DIR`, else the current directory, but never the whole checkout (a folder whose
    `examples/` is this one: run from the repository root, or a folder linking to its examples)."""
    if given:
        return Path(given)
    cwd = Path.cwd()
    return HERE / "workspace" if (cwd / "examples").resolve() == HERE else cwd


def run_tool(name: str, arguments: str) -> str:
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        return f"Error: arguments are not JSON: {arguments}"
    path = Path(str(args.get("path", ".")))
    if path.is_absolute() or ".." in path.parts:
        return f"Error: {path} is outside the workspace"
    if name == "list_files":
        if not path.is_dir():
            return f"Error: no such directory: {path}"
        return "\n".join(sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()))
    if name == "read_file":
        return path.read_text() if path.is_file() else f"Error: no such file: {path}"
    return f"Error: unknown tool: {name}"


def stream_call(client: httpx.Client, url: str, body: dict) -> tuple[dict, dict]:
    """One streamed chat completion: the assembled assistant message and what the stream looked like."""
    message: dict = {"role": "assistant", "content": ""}
    calls: dict[int, dict] = {}
    chunks = 0
    t0 = time.perf_counter()
    first = None
    finish = None
    with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            raise SystemExit(f"model call failed: HTTP {r.status_code}: {r.read().decode()}")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise SystemExit(f"model call failed mid-stream: {chunk['error']}")
            chunks += 1
            first = first or time.perf_counter() - t0
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                message["content"] += delta.get("content") or ""
                if delta.get("reasoning_content"):
                    message["reasoning_content"] = (
                        message.get("reasoning_content", "") + delta["reasoning_content"]
                    )
                for tc in delta.get("tool_calls") or []:
                    slot = calls.setdefault(
                        tc["index"], {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                    )
                    slot["id"] = tc.get("id") or slot["id"]
                    fn = tc.get("function") or {}
                    slot["function"]["name"] += fn.get("name") or ""
                    slot["function"]["arguments"] += fn.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    stats = {
        "chunks": chunks,
        "first_chunk_s": first,
        "total_s": time.perf_counter() - t0,
        "finish_reason": finish,
    }
    return message, stats


def main() -> int:
    base = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1").rstrip("/")
    key = os.environ.get("OPENAI_API_KEY", "none")
    args = sys.argv[1:]
    given = None
    if "--workspace" in args:
        i = args.index("--workspace")
        given, args = args[i + 1], args[:i] + args[i + 2 :]
    os.chdir(workspace(given))
    prompt = args[0] if args else USER_PROMPTS[0]
    messages: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}]
    with httpx.Client(headers={"authorization": f"Bearer {key}"}, timeout=300) as client:
        for turn in range(MAX_TURNS):
            body = {
                "model": "tiny",
                "messages": messages,
                "tools": TOOLS,
                "stream": True,
                "temperature": 0,
                "max_tokens": 256,
                "stream_options": {"include_usage": True},
            }
            reply, stats = stream_call(client, base + "/chat/completions", body)
            messages.append(reply)
            print(
                json.dumps(
                    {
                        "turn": turn + 1,
                        **stats,
                        "tool_calls": [c["function"]["name"] for c in reply.get("tool_calls", [])],
                    }
                ),
                flush=True,
            )
            if not reply.get("tool_calls"):
                print(json.dumps({"final": reply["content"]}), flush=True)
                return 0
            for call in reply["tool_calls"]:
                result = run_tool(call["function"]["name"], call["function"]["arguments"])
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    print(json.dumps({"error": f"no final answer after {MAX_TURNS} turns"}), flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
