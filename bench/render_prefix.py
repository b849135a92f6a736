"""Prompt construction benchmark: what `PrefixIndex.build` costs per call at turn 1, 32 and 128 of an agent
episode, for each real chat template (../shared/fixtures/chat-templates/) and the project's own, against
rendering the whole conversation fresh.

    python bench/render_prefix.py [--quick] [--json bench/results/render-prefix.json]

An episode turn is an assistant tool call and its tool result (one call a turn, as every family allows),
after a system prompt with two tools and a user query. At turn 1 the call is rendered fresh; at later
turns it extends the call before it (T2), and what it costs must not grow with the context: the tail is
cut from a short stand-in conversation. The whole-conversation checks (`check="once"`: at 1, 2, 4, 8...
messages per shape of continuation) are part of the figures: each turn is measured as it is served,
on a fresh index that was driven to that turn, so the median shows the steady cost and the max shows a
turn that also ran a check. Each template's tokenizer is the tiny kit's, with that template's special
tokens (built in seconds, no model weights).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from array import array
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from polarproxy.conversation import Completion, Conversation, Message, Tool, ToolCall  # noqa: E402
from polarproxy.render.prefix import PrefixIndex, Turn  # noqa: E402
from polarproxy.render.renderer import Renderer  # noqa: E402
from polarproxy.tiny import write_tokenizer_folder  # noqa: E402
from polarproxy.tiny.formats import detect_family  # noqa: E402

TEMPLATES = REPO.parent / "shared" / "fixtures" / "chat-templates"
TOOLS = [
    Tool(
        name="run_shell_command",
        description="Run a shell command in the workspace and return its output.",
        parameters={
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command line."}},
            "required": ["command"],
        },
    ),
    Tool(
        name="read_file",
        description="Read a text file of the workspace.",
        parameters={"type": "object", "properties": {"path": {"type": "string", "description": "File."}}},
    ),
]
RESULT = "tests/test_module.py ....F.\nFAILED tests/test_module.py::test_edge - AssertionError: 3 != 4\n" * 3


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Episode:
    """A scripted agent episode through one PrefixIndex, served call by call."""

    def __init__(self, r: Renderer) -> None:
        self.r = r
        self.family = detect_family(r.tokenizer.chat_template)
        self.index = PrefixIndex(r)
        self.eos_id = r.stop_token_ids[0]
        self.messages = [
            Message(role="system", content="You are a coding agent. Fix the failing test, then say done."),
            Message(role="user", content="The test suite fails; please fix it."),
        ]
        self.turn = 0

    def serve(self) -> float:
        """One call: build its prompt (timed), sample a scripted tool call, send back its result."""
        conv = Conversation(messages=list(self.messages), tools=TOOLS)
        t0 = time.perf_counter()
        prompt = self.index.build("ep", conv)
        seconds = time.perf_counter() - t0
        self.turn += 1
        args = {"command": f"pytest tests/test_module_{self.turn}.py -x -q"}
        out = [*self.r.encode(self.family.write("", [("run_shell_command", args)], None)), self.eos_id]
        call = ToolCall(f"call_{self.turn:09d}", "run_shell_command", json.dumps(args))
        completion = Completion(tool_calls=[call], finish_reason="tool_calls")
        closing = self.r.token_text(self.eos_id)
        turn = Turn(f"c{self.turn}", conv, completion, prompt.tokens, array("i", out), closing, prompt.fold)
        self.index.remember("ep", turn)
        if self.turn > 1 and prompt.mode != "extended":
            raise RuntimeError(f"turn {self.turn} was rendered fresh: {prompt.note}")
        self.messages += [completion.as_message(), Message(role="tool", content=RESULT, tool_call_id=call.id)]
        return seconds


def measure(r: Renderer, turn: int, repeats: int) -> dict[str, Any]:
    """Milliseconds of prompt construction at `turn` (over `repeats` fresh episodes), and of a fresh render
    of the same conversation."""
    builds: list[float] = []
    fresh: list[float] = []
    tokens = 0
    for _ in range(repeats):
        ep = Episode(r)
        for _ in range(turn - 1):
            ep.serve()
        conv = Conversation(messages=list(ep.messages), tools=TOOLS)
        t0 = time.perf_counter()
        ids = r.render(conv).ids
        fresh.append(time.perf_counter() - t0)
        tokens = len(ids)
        builds.append(ep.serve())
    return {
        "turn": turn,
        "prompt_tokens": tokens,
        "build_ms_median": round(statistics.median(builds) * 1000, 3),
        "build_ms_max": round(max(builds) * 1000, 3),
        "fresh_render_ms_median": round(statistics.median(fresh) * 1000, 3),
    }


def steady(r: Renderer, turns: int) -> dict[str, float]:
    """Median build cost over turns 2..`turns` of one episode, and over its last quarter."""
    ep = Episode(r)
    costs = [ep.serve() for _ in range(turns)][1:]
    last = costs[-max(len(costs) // 4, 1) :]
    return {
        "all_turns_ms_median": round(statistics.median(costs) * 1000, 3),
        "last_quarter_ms_median": round(statistics.median(last) * 1000, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="turns 1, 4, 16 and 2 repeats (a smoke run)")
    ap.add_argument("--json", type=Path, help="write every figure here")
    a = ap.parse_args()
    turns = (1, 4, 16) if a.quick else (1, 32, 128)
    repeats = 2 if a.quick else 7
    names = [None, *sorted(p for p in TEMPLATES.glob("*.jinja"))]
    report: dict[str, Any] = {"turns": list(turns), "repeats": repeats, "templates": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for path in names:
            name = "tiny" if path is None else path.stem
            log(f"{name} ...")
            r = Renderer(write_tokenizer_folder(Path(tmp) / name, chat_template=path))
            rows = [measure(r, t, repeats) for t in turns]
            report["templates"][name] = {"calls": rows, "steady": steady(r, turns[-1])}
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(report, indent=2) + "\n")
    head = f"{'template':24} " + " ".join(f"{'turn ' + str(t):>22}" for t in turns) + f" {'steady':>8}"
    print("prompt construction per call, ms: T2 build (median) / fresh render of the same conversation")
    print(head)
    for name, rep in report["templates"].items():
        cells = " ".join(
            f"{c['build_ms_median']:>10.2f} / {c['fresh_render_ms_median']:>9.2f}" for c in rep["calls"]
        )
        print(f"{name:24} {cells} {rep['steady']['last_quarter_ms_median']:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
