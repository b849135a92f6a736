"""`polarproxy compare` against a hand count on a real store: two harnesses on two tasks, two samples each,
an episode whose harness never reached the model, and calls that extend or do not extend the one before."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from factories import call_start
from typer.testing import CliRunner

from polarproxy.compare import pass_at_k, wilson
from polarproxy.store import CallResult, EpisodeStart, Store

# harness -> task -> rewards of its samples
REWARDS = {"alpha": {"t1": [1.0, 0.0], "t2": [1.0, 1.0]}, "beta": {"t1": [0.0, 0.0], "t2": [1.0, 0.0]}}


def _call(store: Store, eid: str, prompt: list[int], output: list[int], mode: str) -> None:
    cid, _ = store.begin_call(call_start(eid, prompt, render_mode=mode))
    store.finish_call(cid, CallResult(status="ok", output_ids=output, output_logprobs=[-0.1] * len(output)))


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "c.db"
    with Store.open(str(path)) as store:
        for harness, tasks in REWARDS.items():
            for task, rewards in tasks.items():
                for i, r in enumerate(rewards):
                    eid = store.create_episode(EpisodeStart(command=[harness], harness=harness, task=task))
                    # three calls: the second extends the first, the third starts afresh (compaction)
                    _call(store, eid, [1, 2, 3], [4, 5], "fresh")
                    _call(store, eid, [1, 2, 3, 4, 5, 6], [7], "extended")
                    _call(store, eid, [9, 9], [8, 8, 8], "fresh")
                    stages = (
                        {"prewarm": 0.5, "execute": 10.0 + 2 * i, "evaluate": 1.0}
                        if harness == "alpha"
                        else None
                    )
                    store.finish_episode(eid, status="ok", exit_code=0, stages=stages)
                    store.set_reward(eid, r)
        eid = store.create_episode(EpisodeStart(command=["beta"], harness="beta", task="t1"))
        store.finish_episode(eid, status="failed", exit_code=127)  # never reached the model: infra
    return path


def test_compare_gives_the_hand_counted_figures_per_harness_and_task(db: Path, tmp_path: Path) -> None:
    from polarproxy.cli import make_app

    md = tmp_path / "report.md"
    res = CliRunner().invoke(make_app("compare"), ["compare", "--db", str(db), "--json", "--md", str(md)])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["schema"] == "compare.v1"
    a, b = report["harnesses"]["alpha"], report["harnesses"]["beta"]
    assert (a["episodes"], a["rewarded"], a["resolved"]) == (4, 4, 3)
    assert (b["episodes"], b["rewarded"], b["resolved"]) == (5, 4, 1)
    assert a["resolved_rate"] == 0.75 and b["resolved_rate"] == 0.25
    lo, hi = a["resolved_rate_wilson95"]
    # Wilson by hand for 3 of 4: (p + z²/2n ± z√(p(1-p)/n + z²/4n²)) / (1 + z²/n)
    z, n, p = 1.959963984540054, 4, 0.75
    centre, half = (
        (p + z * z / (2 * n)) / (1 + z * z / n),
        z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n),
    )
    assert (lo, hi) == pytest.approx((centre - half, centre + half))
    assert a["pass_at_k"] == pytest.approx({"1": 0.75, "2": 1.0})  # t1: 1 of 2, t2: 2 of 2
    assert b["pass_at_k"] == pytest.approx({"1": 0.25, "2": 0.5})  # t1: 0 of 2, t2: 1 of 2
    assert a["mean_reward"] == 0.75 and b["mean_reward"] == 0.25
    assert a["calls_per_episode"] == 3 and b["calls_per_episode"] == 12 / 5
    assert a["prompt_tokens_per_episode"] == 11 and a["sampled_tokens_per_episode"] == 6
    assert a["t2_extension_rate"] == 0.5  # of the two calls after the first, one extended
    assert a["failures"] == {} and b["failures"] == {"infra": 1}
    # alpha's four episodes: execute 10 and 12 s per task (samples 0 and 1); beta's were not rolled out
    assert a["stage_s"] == {"prewarm": 0.5, "execute": 11.0, "evaluate": 1.0} and b["stage_s"] == {}
    assert report["tasks"] == {"t1": ["alpha"], "t2": ["alpha", "beta"]}
    text = md.read_text()
    assert "| alpha | 4 | 3/4 (75.0%) |" in text and "| t1 | solved | - |" in text
    assert "| prewarm 0.5, execute 11.0, evaluate 1.0 |" in text
    only = CliRunner().invoke(
        make_app("compare"), ["compare", "--db", str(db), "--harness", "beta", "--json"]
    )
    assert list(json.loads(only.stdout)["harnesses"]) == ["beta"]


def test_the_estimators() -> None:
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 5, 3) == 1.0
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))
    assert wilson(0, 0) is None
    lo, hi = wilson(0, 10)
    assert lo == 0.0 and 0.2 < hi < 0.35  # a run of failures still leaves room


def test_names_are_one_cell_each_and_cannot_drive_the_terminal(tmp_path: Path) -> None:
    """A task's or harness's name is text: a `|` in it is not a column, an escape is shown as \\xNN."""
    from polarproxy.cli import make_app

    path = tmp_path / "n.db"
    with Store.open(str(path)) as store:
        eid = store.create_episode(EpisodeStart(command=["h"], harness="h|x", task="t|\x1b[2J"))
        _call(store, eid, [1, 2], [3], "fresh")
        store.finish_episode(eid, status="ok", exit_code=0)
        store.set_reward(eid, 1.0)
    res = CliRunner().invoke(make_app("compare"), ["compare", "--db", str(path)])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.stdout
    assert "| h\\|x | 1 |" in res.stdout and "| t\\|\\x1b[2J | solved |" in res.stdout, res.stdout
