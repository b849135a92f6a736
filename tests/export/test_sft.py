"""SFT export (`polarproxy export --format sft`): trajectories of text-fidelity calls as chat messages."""

from __future__ import annotations

import base64
import json
import time

import jsonschema
import pytest
from typer.testing import CliRunner

from polarproxy.ages import parse_time
from polarproxy.cli import app
from polarproxy.conversation import Completion, Conversation, Message, Tool, ToolCall, Usage
from polarproxy.export.schema import load_schema
from polarproxy.export.sft import (
    SFTFilters,
    TemplateTokenization,
    TiktokenTokenization,
    sft_rows,
    tokenize,
)
from polarproxy.store.records import CallResult, CallStart, EpisodeStart
from polarproxy.store.store import Store

SYSTEM = Message(role="system", content="You are a coding agent.")
USER = Message(role="user", content="List the files, then say done.")
LS = ToolCall(id="toolu_1", name="Bash", arguments='{"command": "ls"}')
TOOLS = [Tool(name="Bash", description="Run a command", parameters={"type": "object"})]


def _record(
    store: Store,
    episode: str,
    messages: list[Message],
    answer: Completion,
    *,
    model: str = "claude-x",
    status: str = "ok",
    tools: list[Tool] = TOOLS,
) -> str:
    conv = Conversation(messages=messages, tools=tools, model=model, stream=True)
    call_id, _ = store.begin_call(
        CallStart(
            episode_id=episode,
            dialect="anthropic",
            method="POST",
            path="/v1/messages",
            model=model,
            stream=True,
            request_headers={},
            request_body="{}",
            conversation=conv.to_dict(),
            prompt_ids=[],
            backend="https://api.anthropic.com",
            backend_kind="provider",
            fidelity="text",
            started_at=time.time(),
        )
    )
    store.finish_call(
        call_id,
        CallResult(
            status=status,
            completion=answer.to_dict(),
            finish_reason=answer.finish_reason,  # type: ignore[arg-type]
            response_body="",
            latency_ms=5.0,
            ttft_ms=1.0,
            ended_at=time.time(),
        ),
    )
    return call_id


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "sft.db")
    yield s
    s.close()


def agent_episode(store: Store, *, harness: str = "claude", status: str = "ok", reward: float | None = 1.0):
    """A tool loop (two calls, the second continues the first; the harness drops the reasoning it sends back)
    and a side request (a title) that continues nothing."""
    ep = store.create_episode(EpisodeStart(command=["claude"], harness=harness, task="ls"))
    first = Completion(
        text="Listing.",
        reasoning="I should run ls.",
        tool_calls=[LS],
        finish_reason="tool_calls",
        usage=Usage(40, 10),
    )
    c1 = _record(store, ep, [SYSTEM, USER], first)
    title = _record(
        store,
        ep,
        [Message(role="user", content="Title for: list files")],
        Completion(text="Listing files"),
        model="claude-haiku",
        tools=[],
    )
    sent_back = Message(
        role="assistant", content="Listing.", tool_calls=[ToolCall("toolu_1", "Bash", '{"command":"ls"}')]
    )
    result = Message(role="tool", content="README.md\nhello.py", tool_call_id="toolu_1")
    c2 = _record(
        store, ep, [SYSTEM, USER, sent_back, result], Completion(text="Done: two files.", reasoning="Two.")
    )
    store.finish_episode(ep, status=status, exit_code=0 if status == "ok" else 1)
    if reward is not None:
        store.set_reward(ep, reward)
    return ep, [c1, title, c2]


def rows_of(store: Store, **kw) -> list[dict]:
    episodes = {e.id: e for e in store.list_episodes(limit=None)}
    return list(sft_rows(store.iter_calls(), episodes, **kw))


def test_a_tool_loop_is_one_row_and_a_side_request_another(store):
    _, (c1, title, c2) = agent_episode(store)
    rows = rows_of(store)
    assert [r["call_ids"] for r in rows] == [[title], [c1, c2]]
    loop = rows[1]
    assert [m["role"] for m in loop["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    first = loop["messages"][2]
    assert first["reasoning_content"] == "I should run ls."  # from the record, though the harness dropped it
    assert first["tool_calls"] == [
        {"id": "toolu_1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}
    ]
    assert loop["messages"][3] == {
        "role": "tool",
        "content": "README.md\nhello.py",
        "tool_call_id": "toolu_1",
    }
    assert loop["messages"][4] == {
        "role": "assistant",
        "content": "Done: two files.",
        "reasoning_content": "Two.",
    }
    assert loop["tools"][0]["function"]["name"] == "Bash"
    assert loop["fidelity"] == ["text"] and loop["harness"] == "claude" and loop["reward"] == 1.0
    assert rows[0]["tools"] == [] and rows[0]["model"] == "claude-haiku"


def test_rows_are_schema_valid(store):
    agent_episode(store)
    schema = load_schema("sft-row.v1")
    for row in rows_of(store):
        jsonschema.validate(row, schema)
    row = rows_of(store)[0]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**row, "input_ids": [1, 2]}, schema)  # ids without mask and tokenization


def test_failed_calls_are_left_out_and_their_turn_starts_no_chain(store):
    ep = store.create_episode(EpisodeStart(command=["x"]))
    _record(store, ep, [USER], Completion(text="partial"), status="failed")
    ok = _record(store, ep, [USER], Completion(text="whole answer"))
    rows = rows_of(store)
    assert [r["call_ids"] for r in rows] == [[ok]]


def test_filters(store):
    good, _ = agent_episode(store, harness="claude", reward=1.0)
    agent_episode(store, harness="codex", reward=0.0)
    agent_episode(store, harness="claude", status="failed", reward=None)
    assert {r["episode_id"] for r in rows_of(store, filters=SFTFilters(status="ok", min_reward=0.5))} == {
        good
    }
    assert {r["harness"] for r in rows_of(store, filters=SFTFilters(harness="codex"))} == {"codex"}
    assert {r["model"] for r in rows_of(store, filters=SFTFilters(model_name="claude-h*"))} == {
        "claude-haiku"
    }
    assert rows_of(store, filters=SFTFilters(since=time.time() + 60)) == []
    assert len(rows_of(store, filters=SFTFilters(since=parse_time("1h")))) == 6
    with pytest.raises(Exception, match="Unknown --status 'good'"):
        SFTFilters(status="good")


def _trainable_runs(ids: list[int], mask: list[int], decode) -> list[str]:
    runs, cur = [], []
    for i, m in zip(ids, mask, strict=True):
        if m:
            cur.append(i)
        elif cur:
            runs.append(decode(cur))
            cur = []
    if cur:
        runs.append(decode(cur))
    return runs


def test_tokenizer_ids_decode_to_the_rendered_text_and_mask_the_assistant_turns(store, random_model_dir):
    agent_episode(store)
    tok = TemplateTokenization(random_model_dir)
    row = rows_of(store, tokenization=tok)[1]
    text = tok.renderer.tokenizer.apply_chat_template(
        row["messages"], tools=row["tools"], add_generation_prompt=False, tokenize=False
    )
    assert tok.decode(row["input_ids"]) == text
    assert len(row["input_ids"]) == len(row["loss_mask"])
    assert row["tokenization"] == {
        "retokenized": True,
        "kind": "chat-template",
        "tokenizer": str(random_model_dir),
    }
    # each assistant turn, as the template writes it: after the assistant header, up to its end marker
    turns = [
        piece[: piece.index("<|im_end|>") + len("<|im_end|>")]
        for piece in text.split("<|im_start|>assistant\n")[1:]
    ]
    assert _trainable_runs(row["input_ids"], row["loss_mask"], tok.decode) == turns
    assert "I should run ls." in turns[0] and "Done: two files." in turns[1]
    jsonschema.validate(row, load_schema("sft-row.v1"))


def test_tokenizer_mask_holds_when_the_template_drops_old_reasoning(random_model_dir):
    tok = TemplateTokenization(random_model_dir)
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "reasoning_content": "greet back"},
        {"role": "user", "content": "bye"},
        {"role": "assistant", "content": "goodbye", "reasoning_content": "part"},
    ]
    out = tokenize(tok, messages, [])
    text = tok.renderer.tokenizer.apply_chat_template(messages, add_generation_prompt=False, tokenize=False)
    assert "greet back" not in text  # the tiny Qwen-style template drops reasoning before the last user turn
    assert tok.decode(out["input_ids"]) == text
    runs = _trainable_runs(out["input_ids"], out["loss_mask"], tok.decode)
    assert runs == ["hello<|im_end|>", "<think>\npart\n</think>\n\ngoodbye<|im_end|>"]


def _ranks_file(tmp_path):
    """A byte-level tiktoken vocabulary made here (every byte, plus a few merges): no download."""
    tokens = [bytes([i]) for i in range(256)] + [b"im", b"<|", b"|>", b"ls", b"Done"]
    path = tmp_path / "tiny.tiktoken"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(tokens)))
    return path


def test_tiktoken_encoding_from_a_ranks_file_made_here(store, tmp_path):
    agent_episode(store)
    tok = TiktokenTokenization.load(str(_ranks_file(tmp_path)))
    row = rows_of(store, tokenization=tok)[1]
    segments = tok.segments(row["messages"], row["tools"])
    assert tok.decode(row["input_ids"]) == "".join(text for text, _ in segments)
    runs = _trainable_runs(row["input_ids"], row["loss_mask"], tok.decode)
    assert runs == [text for text, trainable in segments if trainable]
    assert runs[0].startswith("<think>\nI should run ls.\n</think>\nListing.") and runs[1].endswith(
        "Done: two files.<|im_end|>"
    )
    assert row["tokenization"]["kind"] == "tiktoken"


def test_export_command_writes_sft_rows(store, tmp_path, random_model_dir):
    good, _ = agent_episode(store)
    agent_episode(store, status="failed")
    out = tmp_path / "sft.jsonl"
    db = str(tmp_path / "sft.db")
    r = CliRunner().invoke(
        app,
        [
            "export",
            "--format",
            "sft",
            "--out",
            str(out),
            "--db",
            db,
            "--status",
            "ok",
            "--tokenizer",
            str(random_model_dir),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary["rows"] == len(rows) == 2 and {row["episode_id"] for row in rows} == {good}
    assert all(row["tokenization"]["retokenized"] for row in rows)
    r = CliRunner().invoke(
        app,
        ["export", "--format", "sft", "--out", str(out), "--db", db, "--tokenizer", "x", "--encoding", "y"],
    )
    assert r.exit_code == 1 and "--tokenizer and --encoding both given" in r.output
