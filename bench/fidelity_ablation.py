"""The re-tokenization ablation: for a recorded 20-turn tool episode on each chat template (the real ones
in ../shared/fixtures/chat-templates/ and the project's own), the share of prompt tokens a system that
re-renders the conversation each call would have fed the model differently from what it saw and sampled,
side by side with polarproxy's (0: every later prompt starts with the earlier prompt + the sampled tokens).

    python bench/fidelity_ablation.py [--turns 20] [--quick] [--json bench/results/fidelity-latest.json]

Each episode is a real `polarproxy record` of a small Chat Completions agent (it sends every answer back as
it got it, reasoning included, as Qwen Code does) against a scripted `polarproxy backend` on a tiny
random-weights model with that template: each turn the model reasons and calls a tool in its family's
format; the agent runs the tool and sends the result. The agent asks two questions (a second user turn
half way), so templates that drop or move earlier turns' reasoning once a new question comes show it. `polarproxy audit` then re-renders every call fresh.
"drifted" counts the recorded prompt tokens from the first position where the fresh render differs (what
a re-tokenizing system would have fed differently); polarproxy's figure is its count of extended calls
whose prompt does not start with the earlier prompt + output (prefix breaks), in tokens.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from polarproxy.audit.episodes import audit_store  # noqa: E402
from polarproxy.store.store import Store  # noqa: E402

TEMPLATES = REPO.parent / "shared" / "fixtures" / "chat-templates"

AGENT = r"""
import json, os, sys
from pathlib import Path
import httpx

TURNS, KEEP_REASONING = int(sys.argv[1]), sys.argv[2] == "keep"
TOOLS = [{"type": "function", "function": {"name": n, "description": d, "parameters": {
    "type": "object", "properties": {"path": {"type": "string", "description": "A path."}},
    "required": ["path"]}}} for n, d in (("list_files", "List a folder."), ("read_file", "Read a file."))]
base = os.environ["OPENAI_BASE_URL"].rstrip("/")
messages = [{"role": "system", "content": "You are a coding agent with file tools."}]
with httpx.Client(timeout=300) as client:
    for ask in ("Read the notes in notes/ one by one.", "Go on: read them again and check each."):
        messages.append({"role": "user", "content": ask})
        for _ in range(TURNS):  # until the model answers without a tool call
            r = client.post(base + "/chat/completions", json={"model": "m", "messages": messages,
                                                              "tools": TOOLS, "max_tokens": 256})
            if r.status_code != 200:
                raise SystemExit(f"HTTP {r.status_code}: {r.text}")
            reply = {k: v for k, v in r.json()["choices"][0]["message"].items() if v is not None}
            if not KEEP_REASONING:
                reply.pop("reasoning_content", None)
            messages.append(reply)
            if not reply.get("tool_calls"):
                break
            for c in reply["tool_calls"]:
                p = Path(json.loads(c["function"]["arguments"])["path"])
                out = "\n".join(sorted(x.name for x in p.iterdir())) if c["function"]["name"] == "list_files" \
                    else p.read_text()
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": out})
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def script(turns: int) -> dict[str, Any]:
    """Each of the agent's two questions gets turns/2 calls: tool calls, then a text answer (templates
    such as Mistral's refuse a user message that follows tool results without an answer between)."""
    steps: list[dict[str, Any]] = [
        {
            "reasoning": "First see what the notes folder holds.",
            "tool_calls": [{"name": "list_files", "arguments": {"path": "notes"}}],
        }
    ]
    for k in range(1, turns // 2 - 1):
        steps.append(
            {
                "reasoning": f"Note {k} is next; I will read it and keep its point in mind.",
                "text": f"Reading note {k}.",
                "tool_calls": [{"name": "read_file", "arguments": {"path": f"notes/{k:02d}.txt"}}],
            }
        )
    return {
        "steps": steps,
        "final": "The notes describe the project's goals, one per note.",
        "side_answer": "OK",
    }


def start_backend(model: Path, script_file: Path) -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, "-m", "polarproxy", "backend", "--model", str(model), "--port", "0"]
    proc = subprocess.Popen([*argv, "--script", str(script_file)], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:
        m = re.search(r"on (http://[\d.]+:\d+)", line)
        if m:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, m.group(1)
    raise RuntimeError(f"the backend for {model} did not start")


def record_and_audit(model: Path, url: str, work: Path, turns: int, reasoning: str) -> dict[str, Any]:
    """One `polarproxy record` of the agent (sending reasoning back or not), audited."""
    db = work / f"rec-{reasoning}.db"
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "polarproxy", "record", "--backend", url, "--model", str(model)]
    cmd += ["--db", str(db), "--", sys.executable, str(work / "agent.py"), str(turns), reasoning]
    r = subprocess.run(cmd, cwd=work / "ws", capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"record in {work} failed:\n{r.stderr[-3000:]}")
    seconds = time.perf_counter() - t0
    store = Store.open(str(db))
    calls = [c for ep in store.list_episodes() for c in store.list_calls(ep.id)]
    total = audit_store(store).total
    return {
        "reasoning_sent_back": reasoning == "keep",
        "calls": len(calls),
        "extended_calls": sum(c.render_mode == "extended" for c in calls),
        "fresh_later_calls": sum(c.render_mode != "extended" for c in calls[1:]),
        "prompt_tokens": total.prompt_tokens,
        "retokenized_drifted_tokens": total.drifted_tokens,
        "retokenized_drifted_share": round(total.drifted_share, 4),
        "drifted_calls": total.drifted,
        "polarproxy_prefix_breaks": total.prefix_breaks,
        "record_seconds": round(seconds, 1),
    }


def one_template(name: str, template: Path | None, turns: int, tmp: Path) -> list[dict[str, Any]]:
    from polarproxy.tiny import build_tiny_model

    work = tmp / name
    model = build_tiny_model(work / "model", train_steps=0, chat_template=template)
    ws = work / "ws"
    (ws / "notes").mkdir(parents=True)
    for k in range(1, turns):
        (ws / "notes" / f"{k:02d}.txt").write_text(
            f"Goal {k}: keep the tests green while adding feature {k}.\n"
        )
    (work / "script.json").write_text(json.dumps(script(turns)))
    (work / "agent.py").write_text(AGENT)
    backend, url = start_backend(model, work / "script.json")
    try:
        return [{"template": name, **record_and_audit(model, url, work, turns, r)} for r in ("keep", "drop")]
    finally:
        backend.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=20, help="tool turns per episode (default 20)")
    ap.add_argument("--quick", action="store_true", help="4 turns on the Qwen3 template (a smoke run)")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--only", help="one template by name (e.g. qwen3, polarproxy-tiny)")
    ap.add_argument("--keep", type=Path, help="keep the models and recordings in this folder (for `audit`)")
    a = ap.parse_args()
    names: list[tuple[str, Path | None]] = [("polarproxy-tiny", None)]
    names += [(p.stem, p) for p in sorted(TEMPLATES.glob("*.jinja"))]
    turns = a.turns
    if a.quick:
        names, turns = [n for n in names if n[0] == "qwen3"], 4
    if a.only:
        names = [n for n in names if n[0] == a.only]
        if not names:
            ap.error(f"--only {a.only!r}: no such template in {TEMPLATES}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="pp-ablation-") as tmp:
        work = a.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name, path in names:
            for row in one_template(name, path, turns, work):
                rows.append(row)
                log(
                    f"{name:24} reasoning {'kept' if row['reasoning_sent_back'] else 'dropped':7} "
                    f"calls {row['calls']:3} extended {row['extended_calls']:3} "
                    f"prompt tokens {row['prompt_tokens']:7} re-tokenized drift "
                    f"{row['retokenized_drifted_tokens']:6} ({row['retokenized_drifted_share']:.1%}) "
                    f"polarproxy prefix breaks {row['polarproxy_prefix_breaks']}"
                )
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "turns": turns, "templates": rows}
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
