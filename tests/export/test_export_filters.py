"""One filter mechanism for every export format: --status, --min-reward, --since, --harness, --model-name,
--task and --group keep the same episodes and calls in jsonl, parquet and sft; options that do not apply to
a format are refused (exit 2) instead of being ignored."""

from __future__ import annotations

import subprocess
import sys
import time

import orjson
import pytest

from polarproxy.errors import UsageError
from polarproxy.export import read_parquet_rows
from polarproxy.export.advantages import AdvantageOptions
from polarproxy.export.filters import ExportFilters
from polarproxy.export.run import OptionError, check_options, run_export
from polarproxy.store import CallResult, CallStart, EpisodeStart, Store

FORMATS = ("jsonl", "parquet", "sft")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Four episodes; each has a call to model 'big-1' and a side call to 'small-1'."""
    s = Store.open(tmp_path_factory.mktemp("filters") / "f.db")
    specs = (
        ("a", "ok", "pi", "t1", "g1", 1.0),
        ("b", "failed", "pi", "t1", "g1", 0.0),
        ("c", "ok", "codex", "t2", None, 0.5),
        ("d", "ok", "pi", "t2", None, None),
    )
    for name, status, harness, task, group, reward in specs:
        eid = s.create_episode(EpisodeStart(command=[name], harness=harness, task=task, group_id=group))
        for model in ("big-1", "small-1"):
            conv = {"messages": [{"role": "user", "content": f"{name} {model}"}], "tools": [], "sampling": {}}
            cid, _ = s.begin_call(
                CallStart(
                    eid, "openai_chat", "POST", "/v1/chat/completions", model, False, {}, "{}", conv, [1, 2]
                )
            )
            s.finish_call(
                cid,
                CallResult(
                    status="ok",
                    output_ids=[3],
                    output_logprobs=[-0.5],
                    completion={"text": "ok", "reasoning": None, "tool_calls": []},
                ),
            )
        s.finish_episode(eid, status=status, exit_code=0 if status == "ok" else 1)
        if reward is not None:
            s.set_reward(eid, reward)
    yield s
    s.close()


def _rows(store, tmp_path, fmt, filters):
    out = tmp_path / f"rows.{fmt}"
    summary = run_export(store, out, fmt=fmt, filters=filters)
    rows = (
        list(read_parquet_rows(out))
        if fmt == "parquet"
        else [orjson.loads(x) for x in out.read_bytes().splitlines()]
    )
    assert summary["rows"] == len(rows)
    return rows


def _commands(store, rows):
    return sorted({store.get_episode(r["episode_id"]).command[0] for r in rows})


CASES = [
    (ExportFilters(status="ok"), ["a", "c", "d"]),
    (ExportFilters(min_reward=0.5), ["a", "c"]),
    (ExportFilters(harness="codex"), ["c"]),
    (ExportFilters(harness=("codex", "pi")), ["a", "b", "c", "d"]),  # `--harness codex --harness pi`
    (ExportFilters(harness=("codex", "aider"), status="ok"), ["c"]),
    (ExportFilters(task="t1"), ["a", "b"]),
    (ExportFilters(group="g1", status="failed"), ["b"]),
    (ExportFilters(since=time.time() + 3600), []),
    (ExportFilters(), ["a", "b", "c", "d"]),
]


@pytest.mark.parametrize("fmt", FORMATS)
def test_episode_filters_keep_the_same_episodes_in_every_format(store, tmp_path, fmt):
    for filters, expected in CASES:
        assert _commands(store, _rows(store, tmp_path, fmt, filters)) == expected, filters


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_model_name_glob_keeps_only_matching_calls_in_every_format(store, tmp_path, fmt):
    rows = _rows(store, tmp_path, fmt, ExportFilters(model_name="big-*", status="ok"))
    assert len(rows) == 3 and {r["model"] for r in rows} == {"big-1"}
    assert _rows(store, tmp_path, fmt, ExportFilters(model_name="none-*")) == []


def test_episode_prefixes_are_resolved_and_a_bad_one_is_named(store, tmp_path):
    ids = [e.id for e in store.list_episodes(limit=None)]
    eid = ids[-1]  # the oldest: "a"
    # the shortest prefix that names it alone (IDs made in one millisecond share all but their last characters)
    prefix = next(eid[:k] for k in range(4, len(eid) + 1) if sum(i.startswith(eid[:k]) for i in ids) == 1)
    summary = run_export(store, tmp_path / "one.jsonl", episodes=[prefix])
    assert summary["rows"] == 2 and summary["filters"] == {"episodes": [eid]}
    with pytest.raises(UsageError, match="No episode ID starts with 'ep_nope'"):
        run_export(store, tmp_path / "x.jsonl", episodes=["ep_nope"])


def test_options_that_do_not_apply_are_refused():
    refused = [
        (("jsonl",), {"tokenizer": "/models/x"}, "--tokenizer go with --format sft, not --format jsonl"),
        (("parquet",), {"encoding": "o200k_base"}, "--encoding go with --format sft"),
        (("sft",), {"strategy": "prefix-merge"}, "--strategy do not apply to --format sft"),
        (("sft",), {"include_failed": True}, "--include-failed do not apply"),
        (("sft",), {"advantages": AdvantageOptions("grpo")}, "--advantages do not apply"),
        (("jsonl",), {"advantages": AdvantageOptions(scale="batch")}, "--scale-rewards go with --advantages"),
        (
            ("jsonl",),
            {"advantages": AdvantageOptions(keep_zero_variance=True)},
            "--keep-zero-variance go with",
        ),
        (("jsonl",), {"advantages": AdvantageOptions("rloo", "group")}, "goes with --advantages grpo"),
        (("csv",), {}, "Unknown --format 'csv'"),
    ]
    for args, kw, message in refused:
        with pytest.raises(OptionError, match=message):
            check_options(*args, **kw)
    check_options("sft", encoding="o200k_base")
    check_options("parquet", strategy="prefix-merge", advantages=AdvantageOptions("grpo", "none", True))
    with pytest.raises(UsageError, match="Unknown --status 'good'"):
        ExportFilters(status="good")


def test_the_export_command_refuses_inapplicable_options_with_exit_2(store, tmp_path):
    db = store.url.removeprefix("sqlite:///")
    base = [sys.executable, "-m", "polarproxy", "export", "--db", db, "--out", str(tmp_path / "x.jsonl")]
    r = subprocess.run([*base, "--tokenizer", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "--tokenizer go with --format sft" in r.stderr
    assert not (tmp_path / "x.jsonl").exists()
    r = subprocess.run(
        [*base, "--task", "t1", "--advantages", "grpo", "--json"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    summary = orjson.loads(r.stdout)
    assert summary["filters"] == {"task": "t1"} and summary["advantages"]["groups"] == 1
    assert summary["rows"] == 4  # a (1.0) and b (0.0), two calls each
