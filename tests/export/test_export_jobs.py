"""`export --jobs N`: token rows written from N processes are the rows, in the order, of one process; a
failing worker fails the export and leaves the old file; no part file is left behind (export/parallel.py).

Workers are forked only from a process that runs no other Python thread (a forked copy could wait forever
on a lock such a thread held), and this test process may run some that earlier tests left: so each
parallel export runs in a fresh interpreter (`_fresh`), as `polarproxy export` does."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from test_export_fast_path import FORMATS, STRATEGIES, _agent_loop, _rich_store
from typer.testing import CliRunner

from polarproxy.cli import app
from polarproxy.export import parallel
from polarproxy.export.advantages import AdvantageOptions
from polarproxy.export.filters import ExportFilters
from polarproxy.export.run import OptionError, run_export
from polarproxy.store import Store

_FRESH = """
import json, os, sys
from polarproxy.export import parallel
from polarproxy.export.advantages import AdvantageOptions
from polarproxy.export.filters import ExportFilters
from polarproxy.export.run import run_export
from polarproxy.store import Store

a = json.loads(sys.argv[1])
parallel.MIN_CALLS_PER_JOB = 1  # small test stores: one part per episode where calls allow
if a["fail_workers"]:
    parent, real_open = os.getpid(), Store.open

    def open_in_parent_only(*args, **kw):
        if os.getpid() != parent:
            raise RuntimeError("the disk went away")
        return real_open(*args, **kw)

    Store.open = open_in_parent_only
if a["syncs"]:  # which processes sync a file: one line per call, their PID
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def noting(real):
        def sync(fd):
            with open(a["syncs"], "a") as f:
                print(os.getpid(), file=f)
            real(fd)
        return sync

    os.fsync, os.fdatasync = noting(real_fsync), noting(real_fdatasync)
store = Store.open(a["db"])
try:
    summary = run_export(
        store, a["out"], fmt=a["fmt"], strategy=a["strategy"], jobs=a["jobs"],
        advantages=AdvantageOptions(a["advantages"]) if a["advantages"] else None,
        filters=ExportFilters(model_name=a["model_name"]) if a["model_name"] else None,
    )
except parallel.ExportJobError as e:
    summary = {"error": str(e)}
print(json.dumps(summary | {"pid": os.getpid()}))
"""


def _fresh(
    store: Store,
    out,
    *,
    jobs: int,
    fmt: str = "jsonl",
    strategy: str = "per-request",
    advantages: str | None = None,
    model_name: str | None = None,
    fail_workers: bool = False,
    syncs=None,
) -> dict:
    """run_export(..., jobs=jobs) in a new interpreter on the same database; its summary, or {"error"}."""
    args = {
        "db": store.connect_url,
        "out": str(out),
        "fmt": fmt,
        "strategy": strategy,
        "jobs": jobs,
        "advantages": advantages,
        "model_name": model_name,
        "fail_workers": fail_workers,
        "syncs": None if syncs is None else str(syncs),
    }
    done = subprocess.run(
        [sys.executable, "-c", _FRESH, json.dumps(args)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def rich(tmp_path, sample_recorder):
    store = _rich_store(tmp_path, sample_recorder)
    yield store
    store.close()


def _same_rows(fmt: str, one, many) -> None:
    if fmt == "jsonl":
        assert many.read_bytes() == one.read_bytes()
    else:
        assert pq.read_table(many).equals(pq.read_table(one))


def _leftovers(folder) -> list[str]:
    return [p.name for p in folder.iterdir() if ".part-" in p.name or p.name.endswith(".tmp")]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_three_jobs_write_the_rows_of_one(rich, tmp_path, strategy, fmt):
    out = tmp_path / "out"
    out.mkdir()
    one = run_export(
        rich, out / f"one.{fmt}", strategy=strategy, fmt=fmt, advantages=AdvantageOptions("grpo")
    )
    many = _fresh(rich, out / f"many.{fmt}", jobs=3, strategy=strategy, fmt=fmt, advantages="grpo")
    assert one["jobs"] == 1 and many["jobs"] >= 2  # parts of about equal calls: at most 3
    assert many | {"out": None, "jobs": None, "pid": None} == one | {"out": None, "jobs": None, "pid": None}
    assert one["advantages"]["rows_dropped"] > 0  # counted in a worker (the loop is alone in its group)
    _same_rows(fmt, out / f"one.{fmt}", out / f"many.{fmt}")
    assert _leftovers(out) == []


def test_workers_read_postgresql_on_connections_of_their_own(pg_server, sample_recorder, tmp_path):
    store = Store.open(pg_server.create_database())
    try:
        sample_recorder(store)
        _agent_loop(store)
        for strategy in STRATEGIES:
            one = run_export(store, tmp_path / "one.jsonl", strategy=strategy)
            many = _fresh(store, tmp_path / "many.jsonl", strategy=strategy, jobs=3)
            assert many["jobs"] >= 2 and many["rows"] == one["rows"] > 0
            assert (tmp_path / "many.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()
    finally:
        store.close()


def test_each_process_adds_its_row_groups_to_the_one_file(rich, tmp_path):
    summary = _fresh(rich, tmp_path / "p.parquet", fmt="parquet", jobs=3)
    assert summary["jobs"] >= 2
    assert pq.ParquetFile(tmp_path / "p.parquet").metadata.num_row_groups == summary["jobs"]


def test_filters_apply_in_every_part(rich, tmp_path):
    kw = {"strategy": "prefix-merge", "fmt": "jsonl"}
    one = run_export(rich, tmp_path / "one.jsonl", filters=ExportFilters(model_name="tiny-*"), **kw)
    many = _fresh(rich, tmp_path / "many.jsonl", jobs=2, model_name="tiny-*", **kw)
    assert many["jobs"] == 2 and many["rows"] == one["rows"] > 0
    assert (tmp_path / "many.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()


def test_a_failing_worker_fails_the_export_and_keeps_the_old_file(rich, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    target = out / "rows.jsonl"
    target.write_text("the old export\n")
    summary = _fresh(rich, target, jobs=3, fail_workers=True)
    assert "RuntimeError: the disk went away" in summary["error"]
    assert target.read_text() == "the old export\n"
    assert _leftovers(out) == []


def test_a_process_with_other_threads_exports_in_one_job(rich, tmp_path, monkeypatch):
    """Forking it could leave a worker waiting on a lock another thread held: one job, the same rows."""
    import threading

    monkeypatch.setattr(parallel, "MIN_CALLS_PER_JOB", 1)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    try:
        assert "other threads" in (parallel.why_not_parallel(rich) or "")
        summary = run_export(rich, tmp_path / "t.jsonl", jobs=3)
    finally:
        stop.set()
        other.join()
    assert summary["jobs"] == 1 and summary["rows"] > 0


def test_episodes_are_cut_into_contiguous_parts_of_about_equal_calls(monkeypatch):
    monkeypatch.setattr(parallel, "MIN_CALLS_PER_JOB", 1)
    episodes = [(f"e{i}", n) for i, n in enumerate([10, 10, 10, 10, 40, 10, 10])]
    parts = parallel.split(episodes, 3)
    assert [eid for part in parts for eid in part] == [eid for eid, _ in episodes]  # every one, in order
    assert len(parts) == 3 and all(parts)
    calls = dict(episodes)
    assert [sum(calls[e] for e in p) for p in parts] == [40, 40, 20]
    assert parallel.split(episodes[:2], 8) == [["e0"], ["e1"]]  # no more parts than episodes
    monkeypatch.setattr(parallel, "MIN_CALLS_PER_JOB", 64)
    assert parallel.split(episodes, 4) == [[eid for eid, _ in episodes]]  # too small to split


def test_an_in_memory_store_exports_in_one_job(tmp_path, sample_recorder, monkeypatch):
    monkeypatch.setattr(parallel, "MIN_CALLS_PER_JOB", 1)
    store = Store.open(":memory:")
    sample_recorder(store)
    assert parallel.why_not_parallel(store) is not None
    summary = run_export(store, tmp_path / "m.jsonl", jobs=4)
    assert summary["jobs"] == 1 and summary["rows"] > 0
    store.close()


def test_jobs_go_with_token_formats_only(rich, tmp_path):
    with pytest.raises(OptionError, match="--jobs goes with --format jsonl or parquet"):
        run_export(rich, tmp_path / "s.jsonl", fmt="sft", jobs=2)
    with pytest.raises(OptionError, match="--jobs 0"):
        run_export(rich, tmp_path / "s.jsonl", jobs=0)


def test_cli_export_with_jobs(rich, tmp_path):
    """The CLI takes --jobs (a store this small runs as one job: under 2,000 calls a job)."""
    db = str(tmp_path / "pp.db")
    runner = CliRunner()
    r = runner.invoke(
        app, ["export", "--db", db, "--out", str(tmp_path / "c.jsonl"), "--jobs", "2", "--json"]
    )
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["jobs"] == 1 and summary["rows"] > 0
    bad = runner.invoke(app, ["export", "--db", db, "--out", str(tmp_path / "c.jsonl"), "--jobs", "0"])
    assert bad.exit_code == 2
    sft = runner.invoke(
        app, ["export", "--db", db, "--out", str(tmp_path / "s.jsonl"), "--format", "sft", "--jobs", "2"]
    )
    assert sft.exit_code == 2 and "--jobs goes with" in sft.output


@pytest.mark.parametrize("fmt", FORMATS)
def test_only_the_file_written_is_synced_not_the_workers_parts(rich, tmp_path, fmt):
    """A part is a temporary file, appended to the export and removed: syncing it to disk too would write
    every part twice. The workers leave theirs unsynced; the process that appends them syncs the file."""
    syncs = tmp_path / "syncs"
    out = tmp_path / "out"
    out.mkdir()
    summary = _fresh(rich, out / f"many.{fmt}", jobs=3, fmt=fmt, syncs=syncs)
    assert summary["jobs"] >= 2
    pids = set(syncs.read_text().split())
    assert pids == {str(summary["pid"])}  # workers ran (jobs >= 2) and synced nothing
    one = run_export(rich, out / f"one.{fmt}", fmt=fmt)
    _same_rows(fmt, out / f"one.{fmt}", out / f"many.{fmt}")
    assert one["rows"] == summary["rows"] and _leftovers(out) == []
