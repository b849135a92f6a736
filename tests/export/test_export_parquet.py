"""Parquet and prefix-merge exports: schema-valid rows, equal to the JSONL ones, readable by pyarrow and
`datasets` (offline), written in row groups, and the `polarproxy export --json` statistics."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import orjson
import pyarrow.parquet as pq
import pytest
from jsonschema import Draft202012Validator

from polarproxy.export import load_schema, read_parquet_rows, trajectory_to_row, write_jsonl, write_parquet
from polarproxy.export import parquet as parquet_module
from polarproxy.reconstruct import assert_round_trip, reconstruct
from polarproxy.store import CallResult, CallStart

STRATEGIES = ("per-request", "prefix-merge")


@pytest.fixture
def validator():
    return Draft202012Validator(load_schema("export-row.v3"))


def _trajectories(store, strategy, **kw):
    episodes = {e.id: e for e in store.list_episodes(limit=None)}
    return list(reconstruct(strategy, store.iter_calls(), episodes=episodes, **kw))


def _add_branch(store, episode_id):
    """Two sub-agent calls that both extend the episode's first call."""
    first = store.list_calls(episode_id)[0]
    base = first.prompt_ids + first.output_ids
    ids = []
    for tail, out in (([40], [41, 42]), ([50], [51])):
        start = CallStart(
            episode_id=episode_id,
            dialect="anthropic",
            method="POST",
            path="/v1/messages",
            model="tiny-qwen3",
            stream=False,
            request_headers={},
            request_body="{}",
            prompt_ids=base + tail,
            conversation={"messages": [{"role": "user", "content": "sub"}], "tools": [], "sampling": {}},
            render_mode="extended",
            extended_from=first.id,
        )
        call_id, _ = store.begin_call(start)
        store.finish_call(
            call_id, CallResult(status="ok", output_ids=out, output_logprobs=[-0.25] * len(out))
        )
        ids.append(call_id)
    return ids


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_parquet_rows_equal_the_jsonl_rows_and_validate(recorded, validator, tmp_path, strategy):
    store, ids = recorded
    _add_branch(store, next(iter(ids)))
    trajs = _trajectories(store, strategy, include_failed=True)
    jsonl_stats = write_jsonl(trajs, tmp_path / "rows.jsonl")
    parquet_stats = write_parquet(trajs, tmp_path / "rows.parquet")
    assert jsonl_stats == parquet_stats
    jsonl_rows = [orjson.loads(line) for line in (tmp_path / "rows.jsonl").read_bytes().splitlines()]
    parquet_rows = list(read_parquet_rows(tmp_path / "rows.parquet"))
    assert parquet_rows == jsonl_rows == [trajectory_to_row(t) for t in trajs]
    calls = {c.id: c for c in store.iter_calls()}
    for row in parquet_rows:
        validator.validate(row)
        assert row["strategy"] == strategy
    for t in trajs:
        assert_round_trip(t, [calls[c] for c in t.call_ids])
    table = pq.read_table(tmp_path / "rows.parquet")
    assert table.num_rows == len(trajs)
    assert str(table.schema.field("input_ids").type) == "list<element: int32>"


def test_prefix_merge_rows_fold_chains_and_keep_branches_apart(recorded, validator):
    store, ids = recorded
    ep1, ep2 = ids
    left, right = _add_branch(store, ep1)
    rows = [trajectory_to_row(t) for t in _trajectories(store, "prefix-merge")]
    first, second = ids[ep1][:2]
    # The first call has three children (the tool turn and two sub-agents): three leaves.
    assert [r["call_ids"] for r in rows] == [[first, second], [left], [right], ids[ep2]]
    for row in rows:
        validator.validate(row)
        spans = row["metadata"]["call_output_spans"]
        assert len(spans) == len(row["call_ids"])
        assert [i for s, e in spans for i in range(s, e)] == [i for i, m in enumerate(row["loss_mask"]) if m]


def test_datasets_loads_the_parquet_export_offline(recorded, tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    store, _ = recorded
    trajs = _trajectories(store, "prefix-merge")
    write_parquet(trajs, tmp_path / "rows.parquet")
    ds = datasets.load_dataset(
        "parquet", data_files=str(tmp_path / "rows.parquet"), split="train", cache_dir=str(tmp_path / "cache")
    )
    assert ds.num_rows == len(trajs)
    for got, traj in zip(ds, trajs, strict=True):
        assert got["input_ids"] == traj.input_ids
        assert got["loss_mask"] == traj.loss_mask
        assert got["logprobs"] == traj.logprobs
        assert got["call_ids"] == traj.call_ids
        assert json.loads(got["metadata"]) == traj.metadata
        assert [m["role"] for m in got["messages"]] == [m["role"] for m in traj.messages]


def test_parquet_is_written_in_row_groups(recorded, tmp_path, monkeypatch):
    store, _ = recorded
    monkeypatch.setattr(parquet_module, "ROW_GROUP_ROWS", 2)
    trajs = _trajectories(store, "per-request", include_failed=True)
    write_parquet(trajs, tmp_path / "rows.parquet")
    meta = pq.ParquetFile(tmp_path / "rows.parquet").metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [2, 2]
    monkeypatch.setattr(parquet_module, "ROW_GROUP_ROWS", 4096)
    monkeypatch.setattr(parquet_module, "ROW_GROUP_TOKENS", 5)  # every row holds at least 3 tokens
    write_parquet(trajs, tmp_path / "rows.parquet")
    assert pq.ParquetFile(tmp_path / "rows.parquet").metadata.num_row_groups == 3


def test_a_failed_parquet_export_leaves_the_old_file(recorded, tmp_path):
    store, _ = recorded
    out = tmp_path / "rows.parquet"
    out.write_bytes(b"old")

    def broken():
        yield from _trajectories(store, "prefix-merge")
        raise RuntimeError("reader died")

    with pytest.raises(RuntimeError, match="reader died"):
        write_parquet(broken(), out)
    assert out.read_bytes() == b"old"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_failed_row_group_write_fails_the_export_and_keeps_the_old_file(recorded, tmp_path, monkeypatch):
    store, _ = recorded
    out = tmp_path / "rows.parquet"
    out.write_bytes(b"old")
    monkeypatch.setattr(parquet_module, "ROW_GROUP_ROWS", 1)  # row groups written in the background
    written: list[int] = []
    real = pq.ParquetWriter.write_table

    def write_table(self, table, *args, **kw):
        if written:
            raise OSError(28, "No space left on device")
        written.append(table.num_rows)
        return real(self, table, *args, **kw)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)
    with pytest.raises(OSError, match="No space left"):
        write_parquet(_trajectories(store, "per-request", include_failed=True), out)
    assert written == [1] and out.read_bytes() == b"old"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_an_empty_export_is_a_readable_parquet_file(tmp_path):
    stats = write_parquet([], tmp_path / "empty.parquet")
    assert stats.rows == 0 and stats.sequence_ratio is None
    assert list(read_parquet_rows(tmp_path / "empty.parquet")) == []
    assert pq.read_table(tmp_path / "empty.parquet").num_rows == 0


def _export(db, *args):
    return subprocess.run(
        [sys.executable, "-m", "polarproxy", "export", "--db", str(db), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_export_command_prints_merge_statistics(recorded, tmp_path):
    store, ids = recorded
    _add_branch(store, next(iter(ids)))
    db = store.url.removeprefix("sqlite:///")
    expected_calls = sum(1 for c in store.iter_calls() if c.status == "ok")
    per_request_tokens = sum(len(c.prompt_ids) + len(c.output_ids) for c in store.iter_calls(status="ok"))
    out = tmp_path / "merged.parquet"
    e = _export(db, "--strategy", "prefix-merge", "--format", "parquet", "--out", str(out), "--json")
    assert e.returncode == 0, e.stderr
    stats = json.loads(e.stdout)
    trajs = _trajectories(store, "prefix-merge")
    assert stats == {
        "out": str(out),
        "strategy": "prefix-merge",
        "format": "parquet",
        "rows": len(trajs),
        "calls": expected_calls,
        "trajectories": len(trajs),
        "trainable_tokens": sum(t.trainable_tokens for t in trajs),
        "total_tokens": sum(len(t.input_ids) for t in trajs),
        "per_request_tokens": per_request_tokens,
        "sequence_ratio": expected_calls / len(trajs),
        "skipped_empty_rows": 0,
        "sampling": [
            {"temperature": t, "top_p": p, "top_k": k, "logprob_temperature": lt, "calls": n}
            for (t, p, k, lt), n in Counter(
                (c.temperature, c.top_p, c.top_k, c.logprob_temperature)
                for c in store.iter_calls(status="ok")
            ).most_common()
        ],
        "episodes": len(store.list_episodes(limit=None)),
        "jobs": 1,
        "filters": {},
        "advantages": None,
    }
    assert (stats["calls"], stats["trajectories"]) == (5, 4)
    assert list(read_parquet_rows(out)) == [trajectory_to_row(t) for t in trajs]
    single = _export(db, "--strategy", "per-request", "--out", str(tmp_path / "single.jsonl"), "--json")
    single_stats = json.loads(single.stdout)
    assert single_stats["total_tokens"] == stats["per_request_tokens"]
    assert single_stats["trajectories"] == stats["calls"] and single_stats["sequence_ratio"] == 1.0


def _plain(text: str) -> str:
    """Typer's error box as one line of words (its frame drawn with box characters, wrapped to the width)."""
    return " ".join(text.translate({ord(c): " " for c in "│╭╮╰╯─"}).split())


def test_export_command_names_the_allowed_strategies_and_formats(recorded, tmp_path):
    store, _ = recorded
    db = store.url.removeprefix("sqlite:///")
    e = _export(db, "--strategy", "merge", "--out", str(tmp_path / "x"))
    assert e.returncode == 2
    assert "'merge' is not one of 'per-request', 'prefix-merge'" in _plain(e.stderr)
    e = _export(db, "--format", "csv", "--out", str(tmp_path / "x"))
    assert e.returncode == 2 and "'csv' is not one of 'jsonl', 'parquet', 'sft'" in _plain(e.stderr)
    assert not (tmp_path / "x").exists()


def test_a_trajectory_without_spans_is_converted_token_by_token(tmp_path):
    """Hand-built trajectories (no call_spans, None logprobs among trainable tokens) export the same way."""
    from polarproxy.reconstruct import Trajectory

    traj = Trajectory(
        episode_id="ep_x",
        call_ids=["call_x"],
        strategy="per-request",
        input_ids=[5, 6, 7, 8],
        loss_mask=[0, 1, 1, 0],
        logprobs=[None, -0.5, None, None],
        model="m",
        weight_version=None,
        finish_reason="length",
        metadata={"dialect": "openai_chat", "fidelity": "tokens", "render_mode": "fresh"},
    )
    write_parquet([traj], tmp_path / "x.parquet")
    assert list(read_parquet_rows(tmp_path / "x.parquet")) == [trajectory_to_row(traj)]
