import io
import math
import threading
from collections import Counter
from pathlib import Path

import orjson
import pytest
from jsonschema import Draft202012Validator

from polarproxy.export import ExportStats, load_schema, trajectory_to_row, write_jsonl
from polarproxy.export import atomic as atomic_module
from polarproxy.export.schema import schema_path
from polarproxy.reconstruct import assert_round_trip, per_request


@pytest.fixture
def validator():
    schema = load_schema("export-row.v3")
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _trajectories(store, **kw):
    episodes = {e.id: e for e in store.list_episodes(limit=None)}
    return list(per_request(store.iter_calls(), episodes=episodes, **kw))


def test_per_request_rows_validate_have_equal_lengths_and_round_trip(recorded, validator, tmp_path):
    store, _ = recorded
    trajs = _trajectories(store, include_failed=True)
    out = tmp_path / "out" / "rows.jsonl"
    out.parent.mkdir()
    stats = write_jsonl(trajs, out)
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert len(rows) == len(trajs) == 4
    calls = {c.id: c for c in store.iter_calls()}
    for row, traj in zip(rows, trajs, strict=True):
        validator.validate(row)
        assert len(row["input_ids"]) == len(row["loss_mask"]) == len(row["logprobs"])
        assert all((lp is None) == (m == 0) for m, lp in zip(row["loss_mask"], row["logprobs"], strict=True))
        assert row == trajectory_to_row(traj)
        assert_round_trip(traj, [calls[c] for c in row["call_ids"]])
        # T4 on the row itself: the trainable tokens are the call's sampled IDs with their logprobs
        (call,) = (calls[c] for c in row["call_ids"])
        trainable = [
            (t, lp) for t, m, lp in zip(row["input_ids"], row["loss_mask"], row["logprobs"], strict=True) if m
        ]
        assert trainable == list(zip(call.output_ids, call.output_logprobs, strict=True))
    assert rows[0]["schema_version"] == 3 and rows[0]["reward"] == 1.0 and rows[0]["group_id"] == "g1"
    assert stats == ExportStats(
        rows=4,
        calls=4,
        trainable_tokens=sum(sum(t.loss_mask) for t in trajs),
        total_tokens=sum(len(t.input_ids) for t in trajs),
        per_request_tokens=sum(len(t.input_ids) for t in trajs),
        sampling=Counter({(None, None, None, None): 4}),  # recorded by no gateway: nothing known
    )
    assert stats.trainable_tokens == 3 + 2 + 1 + 1
    assert stats.summary()["sequence_ratio"] == 1.0 and stats.summary()["trajectories"] == 4


def test_a_failed_export_leaves_the_old_file_and_no_temporary_file(recorded, tmp_path):
    store, _ = recorded
    out = tmp_path / "rows.jsonl"
    out.write_text("old\n")

    def broken():
        yield from _trajectories(store)
        raise RuntimeError("reader died")

    with pytest.raises(RuntimeError, match="reader died"):
        write_jsonl(broken(), out)
    assert out.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("pp.db")) == ["rows.jsonl"]
    write_jsonl(_trajectories(store), str(out))
    assert len(out.read_bytes().splitlines()) == 3


def test_writes_to_text_and_binary_streams(recorded):
    store, _ = recorded
    trajs = _trajectories(store)
    text, binary = io.StringIO(), io.BytesIO()
    assert write_jsonl(trajs, text).rows == 3
    write_jsonl(trajs, binary)
    assert text.getvalue().encode() == binary.getvalue()
    assert text.getvalue().endswith("\n") and text.getvalue().count("\n") == 3


def test_a_non_finite_logprob_is_refused_not_written_as_null(recorded, tmp_path):
    store, _ = recorded
    traj = _trajectories(store)[0]
    traj.logprobs[-1] = -math.inf
    with pytest.raises(ValueError, match=r"logprob -inf at position 6, which JSON cannot represent"):
        write_jsonl([traj], tmp_path / "x.jsonl")
    assert not (tmp_path / "x.jsonl").exists()


def test_schema_is_strict(recorded, validator):
    store, _ = recorded
    row = trajectory_to_row(_trajectories(store)[0])
    validator.validate(row)
    bad_rows = {
        "an extra key": {**row, "extra": 1},
        "a missing key": {k: v for k, v in row.items() if k != "reward"},
        "a mask of 2": {**row, "loss_mask": [2, *row["loss_mask"][1:]]},
        "a float token id": {**row, "input_ids": [1.5, *row["input_ids"][1:]]},
        "a negative token id": {**row, "input_ids": [-1, *row["input_ids"][1:]]},
        "a string logprob": {**row, "logprobs": ["x", *row["logprobs"][1:]]},
        "another schema version": {**row, "schema_version": 1},
        "no advantage key": {k: v for k, v in row.items() if k != "advantage"},
        "a string temperature": {**row, "temperatures": ["hot"]},
        "a null mixed flag": {**row, "mixed_weight_versions": [None]},
        "an unknown strategy": {**row, "strategy": "prefix"},
        "no call ids": {**row, "call_ids": []},
        "an extra message key": {**row, "messages": [{**row["messages"][0], "reasoning": "x"}]},
        "an unknown role": {**row, "messages": [{"role": "developer", "content": ""}]},
        "metadata without fidelity": {**row, "metadata": {"dialect": "x", "render_mode": "fresh"}},
    }
    for what, bad in bad_rows.items():
        assert not validator.is_valid(bad), what


def test_load_schema_reads_the_package_data_that_the_top_level_schemas_folder_links_to():
    path = schema_path("export-row.v2.json")
    assert path.parent.name == "schemas" and path.parent.parent.name == "polarproxy"  # shipped in a wheel
    repo = Path(__file__).resolve().parents[2]
    assert (repo / "schemas").resolve() == path.parent.resolve()
    assert load_schema("export-row.v2")["properties"]["schema_version"] == {"const": 2}
    assert load_schema("export-row.v3")["properties"]["schema_version"] == {"const": 3}
    # version 1 stays, to validate files written before
    assert load_schema("export-row.v1")["properties"]["schema_version"] == {"const": 1}
    with pytest.raises(FileNotFoundError, match=r"No schema 'nope'.*Available: export-row\.v1"):
        load_schema("nope")


def test_bytes_are_synced_ahead_in_the_background_and_the_file_is_the_same(recorded, tmp_path, monkeypatch):
    store, _ = recorded
    whole = tmp_path / "whole.jsonl"
    write_jsonl(_trajectories(store), whole)
    synced: list[str] = []
    real = atomic_module.os.fdatasync

    def fdatasync(fd):
        synced.append(threading.current_thread().name)
        real(fd)

    monkeypatch.setattr(atomic_module, "SYNC_AHEAD_BYTES", 1)  # a background sync after every row
    monkeypatch.setattr(atomic_module.os, "fdatasync", fdatasync)
    ahead = tmp_path / "ahead.jsonl"
    write_jsonl(_trajectories(store), ahead)
    assert ahead.read_bytes() == whole.read_bytes()
    assert synced and set(synced) == {"export-sync"}


def test_a_failed_background_sync_fails_the_export_and_keeps_the_old_file(recorded, tmp_path, monkeypatch):
    store, _ = recorded
    out = tmp_path / "rows.jsonl"
    out.write_text("old\n")

    def fdatasync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic_module, "SYNC_AHEAD_BYTES", 1)
    monkeypatch.setattr(atomic_module.os, "fdatasync", fdatasync)
    with pytest.raises(OSError, match="No space left"):
        write_jsonl(_trajectories(store), out)
    assert out.read_text() == "old\n"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
