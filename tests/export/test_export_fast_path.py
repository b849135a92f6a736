"""The array export path (store/token_calls.py → SpanTrajectory → writers) writes what the plain path
(Store.iter_calls → Call → list Trajectory → writers) writes, on one store holding every shape a row can
take; token exports leave out rows without tokens and count them; export files follow the umask."""

from __future__ import annotations

import datetime
import json
import os
import stat

import pyarrow.parquet as pq
import pytest
from sqlalchemy import update
from typer.testing import CliRunner

from polarproxy.cli import app
from polarproxy.export import read_parquet_rows, trajectory_to_row
from polarproxy.export.advantages import AdvantageOptions
from polarproxy.export.filters import ExportFilters
from polarproxy.export.run import run_export
from polarproxy.reconstruct import reconstruct
from polarproxy.store import CallResult, CallStart, EpisodeStart, Store
from polarproxy.store import token_calls as token_calls_module
from polarproxy.store.migrations import migrations_table
from polarproxy.store.schema import calls as calls_table
from polarproxy.store.token_calls import iter_token_calls

STRATEGIES = ("per-request", "prefix-merge")
FORMATS = ("jsonl", "parquet")


def _start(eid: str, prompt: list[int], messages: list[dict], **kw) -> CallStart:
    return CallStart(
        episode_id=eid,
        dialect="openai_chat",
        method="POST",
        path="/v1/chat/completions",
        model=kw.pop("model", "tiny-qwen3"),
        stream=True,
        request_headers={},
        request_body=json.dumps({"messages": messages}),
        prompt_ids=prompt,
        backend_kind="sglang",
        conversation={
            "messages": messages,
            "tools": kw.pop("tools", []),
            "sampling": {"temperature": kw.pop("conv_temperature", None)},
            "model": "tiny-qwen3",
        },
        **kw,
    )


def _finish(store: Store, call_id: str, output: list[int], *, logprobs: bool = True, **kw) -> None:
    store.finish_call(
        call_id,
        CallResult(
            status=kw.pop("status", "ok"),
            output_ids=output,
            output_logprobs=[-0.1 - i / 7 for i in range(len(output))] if logprobs else [],
            completion={"text": f"{len(output)} tokens", "reasoning": None, "tool_calls": []},
            finish_reason="stop",
            weight_version=kw.pop("weight_version", "w1"),
            **kw,
        ),
    )


def _agent_loop(store: Store) -> str:
    """A 12-call loop whose bodies are stored as edits: temperatures set, asked in the request only (a
    store written before m005, simulated below), or absent; a call without logprobs, a text-only call
    (no tokens), a retry from the middle of an earlier output, and a mid-call weight update."""
    eid = store.create_episode(EpisodeStart(command=["pi"], harness="pi", task="loop", group_id="g2"))
    messages = [{"role": "user", "content": "fix the test", "tool_calls": []}]
    prompt = [100, 101, 102, 103, 104, 105, 106, 107, 108]
    prev = None
    for i in range(12):
        kw = {"temperature": 0.7} if i % 3 == 0 else {"conv_temperature": 0.3} if i % 3 == 1 else {}
        cid, _ = store.begin_call(_start(eid, prompt, messages, extended_from=prev, **kw))
        output = [1000 + 10 * i + k for k in range(3 + i % 4)]
        extra = {"weight_version_first": "w0"} if i == 5 else {}
        _finish(store, cid, output, logprobs=i != 4, **extra)
        messages = [
            *messages,
            {"role": "assistant", "content": f"step {i}", "tool_calls": []},
            {"role": "tool", "content": f"result {i}", "tool_call_id": f"c{i}", "tool_calls": []},
        ]
        prompt = prompt + output + [200 + i, 201 + i]
        prev = cid
    first = store.list_calls(eid)[0]
    retry = first.prompt_ids + first.output_ids[:2] + [7, 7, 7]  # shares only part of call 0's output
    cid, _ = store.begin_call(_start(eid, retry, messages[:1]))
    _finish(store, cid, [5, 6])
    text_only, _ = store.begin_call(_start(eid, [], messages, fidelity="text", model="gpt-5"))
    _finish(store, text_only, [], logprobs=False)
    return eid


def _rich_store(tmp_path, record_sample) -> Store:
    store = Store.open(tmp_path / "pp.db")
    ids = record_sample(store)
    loop = _agent_loop(store)
    first_episode, second_episode = ids
    base = store.list_calls(first_episode)[0]
    for tail, out in (([40], [41, 42]), ([50], [51])):  # two sub-agents branching from the first call
        cid, _ = store.begin_call(
            _start(first_episode, base.prompt_ids + base.output_ids + tail, [], extended_from=base.id)
        )
        _finish(store, cid, out)
    # rows recorded before m005 (a database upgraded to it after they were written) have no temperature
    # column value: the request's applies
    with store.engine.begin() as conn:
        conn.execute(update(calls_table).where(calls_table.c.temperature == 0.3).values(temperature=None))
        later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=5)
        conn.execute(
            update(migrations_table)
            .where(migrations_table.c.name == "m005_rewards_and_sampling")
            .values(applied_at=later.isoformat())
        )
    store.set_reward(first_episode, 0.5)
    store.set_reward(second_episode, 0.0)
    store.set_reward(loop, 1.0)  # alone in its group: no advantage
    return store


@pytest.fixture
def rich(tmp_path, monkeypatch, sample_recorder):
    monkeypatch.setattr(token_calls_module, "ROWS_PER_READ", 5)  # several reads per episode, and groups
    store = _rich_store(tmp_path, sample_recorder)
    yield store
    store.close()


def _both(store, tmp_path, fmt: str, strategy: str, **kw):
    outs = []
    for plain in (True, False):
        out = tmp_path / f"{strategy}.{'plain' if plain else 'arrays'}.{fmt}"
        summary = run_export(store, out, fmt=fmt, strategy=strategy, plain=plain, **kw)
        outs.append((out, summary))
    return outs


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("include_failed", [False, True])
def test_array_path_writes_the_rows_of_the_plain_path(rich, tmp_path, strategy, fmt, include_failed):
    (plain, plain_summary), (arrays, summary) = _both(
        rich, tmp_path, fmt, strategy, include_failed=include_failed
    )
    assert summary | {"out": None} == plain_summary | {"out": None}
    assert summary["rows"] > 3 and summary["skipped_empty_rows"] == 1
    if fmt == "jsonl":
        assert arrays.read_bytes() == plain.read_bytes()
        rows = [json.loads(line) for line in arrays.read_bytes().splitlines()]
    else:
        assert pq.read_table(arrays).equals(pq.read_table(plain))
        rows = list(read_parquet_rows(arrays))
    episodes = {e.id: e for e in rich.list_episodes(limit=None)}
    expected = [
        trajectory_to_row(t)
        for t in reconstruct(strategy, rich.iter_calls(), episodes=episodes, include_failed=include_failed)
        if t.input_ids
    ]
    assert rows == expected
    assert any(None in r["temperatures"] for r in rows) and any(0.3 in r["temperatures"] for r in rows)


def test_array_path_equals_plain_path_with_filters_and_advantages(rich, tmp_path):
    kw = {"filters": ExportFilters(model_name="tiny-*"), "advantages": AdvantageOptions("grpo")}
    for strategy in STRATEGIES:
        for fmt in FORMATS:
            (plain, plain_summary), (arrays, summary) = _both(rich, tmp_path, fmt, strategy, **kw)
            assert summary | {"out": None} == plain_summary | {"out": None}
            assert summary["rows"] > 0 and summary["advantages"]["groups"] == 2
            if fmt == "jsonl":
                assert arrays.read_bytes() == plain.read_bytes()
            else:
                assert pq.read_table(arrays).equals(pq.read_table(plain))


def test_token_calls_hold_the_values_of_the_stored_calls(rich):
    plain = list(rich.iter_calls())
    fast = list(iter_token_calls(rich))
    assert [c.id for c in fast] == [c.id for c in plain]
    for f, c in zip(fast, plain, strict=True):
        assert f.prompt_ids.tolist() == c.prompt_ids and f.output_ids.tolist() == c.output_ids
        assert f.output_logprobs.tolist() == c.output_logprobs
        assert (f.conversation, f.completion) == (c.conversation, c.completion)
        assert (f.temperature, f.mixed_weight_versions, f.has_tools) == (
            c.temperature,
            c.mixed_weight_versions,
            c.has_tools,
        )


def test_calls_recorded_after_m005_give_their_temperature_without_reading_the_request(tmp_path, monkeypatch):
    store = Store.open(tmp_path / "pp.db")
    _agent_loop(store)  # temperatures set, asked in the request only (stored in the column), or absent
    plain = {c.id: c.temperature for c in store.iter_calls()}
    read: list[str] = []
    original = token_calls_module._Episode.conversation

    def counted(self, call_id):
        read.append(call_id)
        return original(self, call_id)

    monkeypatch.setattr(token_calls_module._Episode, "conversation", counted)
    fast = {c.id: c.temperature for c in iter_token_calls(store)}
    store.close()
    assert fast == plain and {0.7, 0.3, None} <= set(fast.values())
    assert read == []  # every NULL column here means "none asked": no request body rebuilt


def test_a_non_finite_logprob_is_refused_alike_by_both_paths(tmp_path):
    store = Store.open(tmp_path / "pp.db")
    eid = store.create_episode(EpisodeStart(command=["x"]))
    cid, _ = store.begin_call(_start(eid, [1, 2, 3], []))
    store.finish_call(cid, CallResult(status="ok", output_ids=[4, 5], output_logprobs=[-0.5, float("-inf")]))
    errors = []
    for plain in (True, False):
        for fmt in FORMATS:
            out = tmp_path / f"x.{fmt}"
            with pytest.raises(ValueError, match="logprob -inf at position 4") as e:
                run_export(store, out, fmt=fmt, plain=plain)
            errors.append(str(e.value))
            assert not out.exists()
    assert len(set(errors)) == 1
    store.close()


def _text_only_store(tmp_path) -> str:
    db = tmp_path / "text.db"
    store = Store.open(db)
    eid = store.create_episode(EpisodeStart(command=["codex"], harness="codex"))
    for prompt, output in (([], []), ([1, 2], [3])):
        cid, _ = store.begin_call(_start(eid, prompt, [], fidelity="text" if not prompt else "tokens"))
        _finish(store, cid, output)
    store.close()
    return str(db)


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_without_tokens_are_skipped_and_counted_in_both_summaries(tmp_path, fmt):
    db = _text_only_store(tmp_path)
    runner = CliRunner()
    for strategy in STRATEGIES:
        out = tmp_path / f"o.{fmt}"
        args = ["export", "--db", db, "--out", str(out), "--format", fmt, "--strategy", strategy]
        r = runner.invoke(app, [*args, "--json"])
        assert r.exit_code == 0, r.output
        summary = json.loads(r.stdout)
        assert (summary["rows"], summary["calls"], summary["skipped_empty_rows"]) == (1, 1, 1)
        lines = runner.invoke(app, args)
        assert lines.exit_code == 0, lines.output
        assert "skipped 1 row without tokens (text-only calls)" in lines.stderr
        rows = list(read_parquet_rows(out)) if fmt == "parquet" else out.read_text().splitlines()
        assert len(rows) == 1


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_export_files_follow_the_umask(tmp_path, umask):
    db = _text_only_store(tmp_path)
    store = Store.open(db)
    old = os.umask(umask)
    try:
        for fmt in ("jsonl", "parquet", "sft"):
            out = tmp_path / f"u.{fmt}"
            run_export(store, out, fmt=fmt)
            assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask, fmt
    finally:
        os.umask(old)
        store.close()
