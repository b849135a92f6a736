"""Multi-turn tool episodes through `polarproxy record` on tiny models that carry real chat templates
(every template in ../shared/fixtures/chat-templates: Qwen3, Qwen3-Coder XML, Mistral, DeepSeek-V3,
Llama 3.1 JSON tools, Hermes 2 Pro), in every dialect: the agent (a small httpx script, AGENT below) asks,
gets two tool calls back parsed, sends the results, and its last answer is cut by the token limit. Every
follow-up call extends the one before it (T2), prefix-merge export gives one trajectory, and the trainable
logprobs are the model's own (a teacher-forced pass agrees within 1e-4). Under `--prefix-policy fresh`,
Mistral's template renders each call its own way (T1 kept, T2 given up): one trajectory per call."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from factories import record_summary

from polarproxy.conversation import Conversation
from polarproxy.render.renderer import Renderer
from polarproxy.store.store import Store

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "tiny"))
from test_tiny_any_template import cached_model  # noqa: E402

DIALECTS = ("openai_chat", "openai_responses", "anthropic", "gemini")
CUT = 3  # the max-tokens of the last call: the final answer is cut
FINAL = "The folder holds README.md and main.py, and README.md says hello to everyone."
SCRIPT = {
    "steps": [
        {
            "reasoning": "I will list the files.",
            "tool_calls": [{"name": "list_files", "arguments": {"path": "."}}],
        },
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "README.md"}}]},
    ],
    "final": FINAL,
    "side_answer": "OK",
}

# The agent: speaks each dialect named on its command line in turn, with httpx to the URLs `record` sets, runs the tools, prints one JSON
# line per turn with what it got back (tool calls as parsed by the proxy, finish reason).
AGENT = r"""
import json, os, sys
from pathlib import Path
import httpx

CUT = int(sys.argv[1])
SCHEMA = {"type": "object", "properties": {"path": {"type": "string", "description": "A path."}},
          "required": ["path"]}
TOOLS = [("list_files", "List the files in a folder."), ("read_file", "Read a file.")]
SYSTEM = "You are a careful assistant with file tools."


def run_tool(name, args):
    p = Path(args["path"])
    if name == "list_files":
        return "\n".join(sorted(x.name for x in p.iterdir()))
    return p.read_text()


def report(calls, finish, text):
    print(json.dumps({"turn": DIALECT, "tool_calls": calls, "finish": finish, "text": text}), flush=True)


client = httpx.Client(timeout=120)


def post(url, body, headers):
    r = client.post(url, json=body, headers=headers)
    if r.status_code != 200:
        raise SystemExit(f"HTTP {r.status_code}: {r.text}")
    return r.json()


def chat():
    url = os.environ["OPENAI_BASE_URL"] + "/chat/completions"
    h = {"authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
    tools = [{"type": "function", "function": {"name": n, "description": d, "parameters": SCHEMA}}
             for n, d in TOOLS]
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}]
    for turn in range(3):
        body = {"model": "tiny", "messages": msgs, "tools": tools, "max_tokens": CUT if turn == 2 else 256}
        choice = post(url, body, h)["choices"][0]
        m = choice["message"]
        calls = m.get("tool_calls") or []
        report([[c["function"]["name"], json.loads(c["function"]["arguments"])] for c in calls],
               choice["finish_reason"], m.get("content"))
        msgs.append({k: v for k, v in m.items() if k in ("role", "content", "tool_calls")})
        for c in calls:
            out = run_tool(c["function"]["name"], json.loads(c["function"]["arguments"]))
            msgs.append({"role": "tool", "tool_call_id": c["id"], "content": out})


def responses():
    url = os.environ["OPENAI_BASE_URL"] + "/responses"
    h = {"authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
    tools = [{"type": "function", "name": n, "description": d, "parameters": SCHEMA} for n, d in TOOLS]
    items = [{"role": "user", "content": ASK}]
    for turn in range(3):
        body = {"model": "tiny", "instructions": SYSTEM, "input": items, "tools": tools,
                "max_output_tokens": CUT if turn == 2 else 256}
        r = post(url, body, h)
        calls = [o for o in r["output"] if o["type"] == "function_call"]
        text = "".join(p["text"] for o in r["output"] if o["type"] == "message" for p in o["content"]
                       if p["type"] == "output_text")
        finish = r["status"] + ":" + str((r.get("incomplete_details") or {}).get("reason"))
        report([[c["name"], json.loads(c["arguments"])] for c in calls], finish, text)
        items += r["output"]
        for c in calls:
            out = run_tool(c["name"], json.loads(c["arguments"]))
            items.append({"type": "function_call_output", "call_id": c["call_id"], "output": out})


def anthropic():
    url = os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages"
    h = {"x-api-key": os.environ["ANTHROPIC_API_KEY"], "anthropic-version": "2023-06-01"}
    tools = [{"name": n, "description": d, "input_schema": SCHEMA} for n, d in TOOLS]
    msgs = [{"role": "user", "content": ASK}]
    for turn in range(3):
        body = {"model": "tiny", "system": SYSTEM, "messages": msgs, "tools": tools,
                "max_tokens": CUT if turn == 2 else 256}
        r = post(url, body, h)
        calls = [b for b in r["content"] if b["type"] == "tool_use"]
        text = "".join(b["text"] for b in r["content"] if b["type"] == "text")
        report([[c["name"], c["input"]] for c in calls], r["stop_reason"], text)
        msgs.append({"role": "assistant", "content": r["content"]})
        if calls:
            msgs.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": c["id"], "content": run_tool(c["name"], c["input"])}
                for c in calls]})


def gemini():
    url = os.environ["GOOGLE_GEMINI_BASE_URL"] + "/v1beta/models/tiny:generateContent"
    h = {"x-goog-api-key": os.environ["GEMINI_API_KEY"]}
    decls = [{"name": n, "description": d, "parameters": SCHEMA} for n, d in TOOLS]
    contents = [{"role": "user", "parts": [{"text": ASK}]}]
    for turn in range(3):
        body = {"contents": contents, "systemInstruction": {"parts": [{"text": SYSTEM}]},
                "tools": [{"functionDeclarations": decls}],
                "generationConfig": {"maxOutputTokens": CUT if turn == 2 else 256}}
        cand = post(url, body, h)["candidates"][0]
        parts = cand["content"]["parts"]
        calls = [p["functionCall"] for p in parts if "functionCall" in p]
        text = "".join(p.get("text", "") for p in parts if not p.get("thought"))
        report([[c["name"], c["args"]] for c in calls], cand["finishReason"], text)
        contents.append(cand["content"])
        if calls:
            contents.append({"role": "user", "parts": [
                {"functionResponse": {"name": c["name"], "id": c.get("id"),
                                      "response": {"output": run_tool(c["name"], c["args"])}}}
                for c in calls]})


RUN = {"openai_chat": chat, "openai_responses": responses, "anthropic": anthropic, "gemini": gemini}
for DIALECT in sys.argv[2:]:  # one conversation per dialect, each asked its own question
    ASK = "List the files, then read README.md (" + DIALECT + ")."
    RUN[DIALECT]()
"""

CUT_FINISH = {
    "openai_chat": "length",
    "openai_responses": "incomplete:max_output_tokens",
    "anthropic": "max_tokens",
    "gemini": "MAX_TOKENS",
}
# (template, --prefix-policy): Mistral writes the tools into the last user message, so a fresh render
# of a later turn does not start with the earlier prompt; `extend` keeps T2 anyway, `fresh` keeps the
# template's own rendering (T1) and gives up T2
EXTENDING = (
    "qwen3",
    "qwen3-coder-xml-tools",
    "mistral-parallel-tools",
    "deepseek-v3-tools",
    "llama3.1-json-tools",
    "hermes-2-pro-tools",
)


def root_conftest():
    """tests/conftest.py as a module (its name, `conftest`, is shared with this folder's conftest)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("root_conftest", REPO / "tests" / "conftest.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def backends(tmp_path_factory) -> Iterator[dict[str, str]]:
    """One scripted `polarproxy backend` per template, started on first use, killed at module end."""
    start_backend = root_conftest().start_backend
    script = tmp_path_factory.mktemp("script") / "script.json"
    script.write_text(json.dumps(SCRIPT))
    started: dict[str, object] = {}

    class Lazy(dict):
        def __missing__(self, name: str) -> str:
            b = start_backend(cached_model(name), "--script", str(script))
            started[name] = b
            self[name] = b.url
            return b.url

    yield Lazy()
    for b in started.values():
        b.kill()  # type: ignore[attr-defined]


@dataclass
class Recorded:
    model: Path
    turns: dict[str, list[dict]]  # dialect -> what the agent got back, turn by turn
    calls: dict[str, list]  # dialect -> its calls, in order
    rows: list[dict]  # the prefix-merge export of the episode


@pytest.fixture(scope="module")
def recorded(backends, tmp_path_factory) -> Callable[[str, str], Recorded]:
    """recorded(template, policy): one `polarproxy record` of the agent speaking all four dialects in
    turn (so one proxy start per case), and its prefix-merge export; made once per case."""
    done: dict[tuple[str, str], Recorded] = {}

    def get(template: str, policy: str) -> Recorded:
        if (template, policy) not in done:
            done[template, policy] = record(
                tmp_path_factory.mktemp(f"{template}-{policy}"), template, policy, backends[template]
            )
        return done[template, policy]

    return get


def record(tmp: Path, template: str, policy: str, backend_url: str) -> Recorded:
    model = cached_model(template)
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("# hello\n")
    (ws / "main.py").write_text("print('hello')\n")
    agent = tmp / "agent.py"
    agent.write_text(AGENT)
    db = tmp / "rec.db"
    cmd = [sys.executable, "-m", "polarproxy", "record", "--backend", backend_url, "--model", str(model)]
    cmd += ["--db", str(db), "--prefix-policy", policy, "--json", "--"]
    cmd += [sys.executable, str(agent), str(CUT), *DIALECTS]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ws, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    print(f"{template} {policy}: record took {time.perf_counter() - t0:.1f} s")
    assert r.returncode == 0, f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    turns: dict[str, list[dict]] = {d: [] for d in DIALECTS}
    for line in r.stdout.splitlines():
        if line.startswith('{"turn"'):
            turn = json.loads(line)
            turns[turn["turn"]].append(turn)
    calls: dict[str, list] = {d: [] for d in DIALECTS}
    for call in Store.open(str(db)).list_calls(record_summary(r.stderr)["episode_id"]):
        calls[call.dialect].append(call)
    out = tmp / "merged.jsonl"
    e = subprocess.run(
        [
            *(sys.executable, "-m", "polarproxy", "export", "--db", str(db)),
            *("--strategy", "prefix-merge", "--out", str(out), "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert e.returncode == 0, e.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return Recorded(model, turns, calls, rows)


def check_dialect_episode(rec: Recorded, dialect: str) -> list:
    """The agent got both tool calls back parsed, in its own dialect, then the cut answer flagged as cut;
    the store holds the three calls, ok. Returns them."""
    turns, calls = rec.turns[dialect], rec.calls[dialect]
    assert [t["tool_calls"] for t in turns] == [
        [["list_files", {"path": "."}]],
        [["read_file", {"path": "README.md"}]],
        [],
    ], turns
    assert turns[2]["finish"] == CUT_FINISH[dialect], turns[2]
    assert turns[2]["text"] and FINAL.startswith(turns[2]["text"].strip()), turns[2]
    assert [c.status for c in calls] == ["ok"] * 3, [(c.status, c.error) for c in calls]
    assert [tc["name"] for tc in calls[0].completion["tool_calls"]] == ["list_files"]
    assert len(calls[2].output_ids) == CUT
    assert calls[2].output_ids[-1] not in Renderer(rec.model).stop_token_ids
    assert calls[0].render_mode == "fresh"
    return calls


def rows_ending_at(rec: Recorded, calls: list) -> list[dict]:
    """The export rows whose tokens end with each of `calls` (prompt + output), in order."""
    rows = [r for c in calls for r in rec.rows if r["input_ids"] == c.prompt_ids + c.output_ids]
    assert len(rows) == len(calls), [len(r["input_ids"]) for r in rec.rows]
    return rows


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("template", EXTENDING)
def test_a_tool_episode_on_a_real_template_extends_every_call_and_merges_to_one_trajectory(
    template, dialect, recorded
):
    from polarproxy.backends.local.model_runner import ModelRunner

    rec = recorded(template, "extend")
    calls = check_dialect_episode(rec, dialect)
    assert [c.render_mode for c in calls[1:]] == ["extended", "extended"], [
        (c.render_mode, c.render_note) for c in calls
    ]
    for prev, cur in itertools.pairwise(calls):
        assert cur.extended_from == prev.id
        n = len(prev.prompt_ids) + len(prev.output_ids)
        assert cur.prompt_ids[:n] == prev.prompt_ids + prev.output_ids
    # prefix-merge: the dialect's three calls are one trajectory (one row per dialect in the episode)
    assert len(rec.rows) == len(DIALECTS)
    (row,) = rows_ending_at(rec, [calls[-1]])
    assert sum(row["loss_mask"]) == sum(len(c.output_ids) for c in calls)
    check_teacher_forced(ModelRunner(rec.model, device="cpu"), row)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_under_the_fresh_policy_mistral_renders_every_call_its_own_way_and_each_is_a_trajectory(
    dialect, recorded
):
    from polarproxy.backends.local.model_runner import ModelRunner

    rec = recorded("mistral-parallel-tools", "fresh")
    calls = check_dialect_episode(rec, dialect)
    # every call is the template's own rendering of its request: it writes the system prompt elsewhere
    # once the user message is no longer the last, and tool-call IDs the model did not sample, so no call
    # starts with the one before's prompt + output, and each is its own trajectory
    renderer = Renderer(rec.model)
    for c in calls:
        assert c.render_mode == "fresh" and c.extended_from is None
        assert c.prompt_ids == renderer.render(Conversation.from_dict(c.conversation)).ids
    for prev, cur in itertools.pairwise(calls):
        n = len(prev.prompt_ids) + len(prev.output_ids)
        assert cur.prompt_ids[:n] != prev.prompt_ids + prev.output_ids
    assert len(rec.rows) == 3 * len(DIALECTS)
    runner = ModelRunner(rec.model, device="cpu")
    for call, row in zip(calls, rows_ending_at(rec, calls), strict=True):
        assert sum(row["loss_mask"]) == len(call.output_ids)
        check_teacher_forced(runner, row)


def check_teacher_forced(runner, row: dict) -> None:
    """The row's trainable tokens carry the model's own logprobs: a teacher-forced pass agrees."""
    n_prompt = row["loss_mask"].index(1)
    scored = runner.score(row["input_ids"][:n_prompt], row["input_ids"][n_prompt:])
    trained = [
        abs(a - b)
        for a, b, m in zip(scored, row["logprobs"][n_prompt:], row["loss_mask"][n_prompt:], strict=True)
        if m
    ]
    assert len(trained) == sum(row["loss_mask"]) and max(trained) < 1e-4, max(trained)
