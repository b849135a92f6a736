"""`polarproxy show`: one call with --call, each call's new tokens only, trainable tokens marked in pipes."""

from __future__ import annotations

import json

import pytest
from factories import add_episode
from typer.testing import CliRunner

from polarproxy.cli import app
from polarproxy.store.store import Store


@pytest.fixture
def recorded(tmp_path):
    db = tmp_path / "s.db"
    store = Store.open(db)
    ep, ids = add_episode(store, turns=3)
    store.close()
    return str(db), ep, ids


def test_show_call_n_shows_only_that_call_and_json_keeps_it_whole(recorded):
    db, ep, ids = recorded
    r = CliRunner().invoke(app, ["show", ep, "--db", db, "--call", "1"])
    assert r.exit_code == 0, r.output
    heads = [line.split()[0] for line in r.stdout.splitlines() if line.startswith("#")]
    assert heads == ["#1"]
    r = CliRunner().invoke(app, ["show", ep, "--db", db, "--call", "1", "--json", "--tokens"])
    calls = json.loads(r.stdout)["calls"]
    assert [c["id"] for c in calls] == [ids[1]] and len(calls[0]["prompt_ids"]) == 20 + 3 + 4


def test_show_prints_the_reward_with_the_graders_tests_and_the_agents_diff(recorded):
    from polarproxy.store.records import RewardOrigin

    db, ep, _ = recorded
    patch = "".join(f"diff --git a/f{i}.py b/f{i}.py\n-old\n+new\n" for i in range(30))  # 90 lines
    grading = {
        "resolved": False,
        "parser": "pytest -rA",
        "tests": {"t::a": "PASSED", "t::b": "FAILED", "t::\x1b]0;owned\x07": "FAILED"},
    }
    with Store.open(db) as store:
        store.finish_episode(ep, status="ok", exit_code=1, stages={"prewarm": 0.25, "execute": 3.5})
        store.set_rewards(
            ep,
            episode=0.0,
            origin=RewardOrigin(
                source="command", command=["python3", "grade.py"], exit_code=1, patch=patch, grading=grading
            ),
        )
    r = CliRunner().invoke(app, ["show", ep, "--db", db])
    assert r.exit_code == 0, r.output
    assert "reward 0  from command `python3 grade.py` (exit 1)" in r.stdout
    assert "stages: prewarm 0.25 s, execute 3.50 s" in r.stdout
    assert "tests: 1 of 3 passed, not resolved (parser: pytest -rA)" in r.stdout and "FAILED t::b" in r.stdout
    assert "\x1b" not in r.stdout and "FAILED t::\\x1b]0;owned\\x07" in r.stdout  # the agent's escapes, shown
    assert (
        "the agent's changes (90 diff lines):" in r.stdout
        and "... 30 more lines (--full shows them)" in r.stdout
    )
    assert "+new" in r.stdout and "diff --git a/f29.py" not in r.stdout
    assert "diff --git a/f29.py" in CliRunner().invoke(app, ["show", ep, "--db", db, "--full"]).stdout
    shown = json.loads(CliRunner().invoke(app, ["show", ep, "--db", db, "--json"]).stdout)["rewards"]
    assert [(x["reward"], x["patch"], x["grading"]) for x in shown] == [(0.0, patch, grading)]


def test_show_call_out_of_range_names_the_range(recorded):
    db, ep, _ = recorded
    r = CliRunner().invoke(app, ["show", ep, "--db", db, "--call", "7"])
    assert r.exit_code == 1 and "no call #7" in r.stderr and "#0 to #2" in r.stderr


def test_tokens_show_each_calls_new_tokens_and_bracket_the_sampled_ones_when_piped(recorded):
    db, ep, _ = recorded
    r = CliRunner().invoke(app, ["show", ep, "--db", db, "--tokens", "--call", "2"])  # CliRunner: not a tty
    assert r.exit_code == 0, r.output
    out = r.stdout
    # call 2 extends call 1 (prompt 27 + output 3 tokens): only the 4 new prompt tokens are shown
    assert "30 tokens of #1's prompt and output not shown" in out
    assert "  [301][302][303][304]⟦[7002][7003][2]⟧\n" in out
    assert "[100]" not in out
    r = CliRunner().invoke(app, ["show", ep, "--db", db, "--tokens", "--call", "2", "--full"])
    assert "[100]" in r.stdout and "not shown" not in r.stdout


def test_ls_filters_by_status_and_says_how_many_of_how_many(tmp_path):
    db = tmp_path / "l.db"
    store = Store.open(db)
    add_episode(store, turns=1)
    failed, _ = add_episode(store, turns=1, end="failed")
    store.close()
    r = CliRunner().invoke(app, ["ls", "--db", str(db), "--status", "failed"])  # piped: plain lines
    assert r.exit_code == 0, r.output
    assert [line.split("\t")[0] for line in r.stdout.splitlines()[1:]] == [failed]
    assert "1 of 1 episodes" in r.stderr
    r = CliRunner().invoke(app, ["ls", "--db", str(db), "--limit", "1"])
    assert len(r.stdout.splitlines()) == 2 and "1 of 2 episodes" in r.stderr
    r = CliRunner().invoke(app, ["ls", "--db", str(db), "--status", "done"])
    assert r.exit_code == 2 and "Unknown episode status 'done'" in r.stderr


HOSTILE = "\x1b]0;pwned\x07\x1b[2J\x9b31m\x7f"  # retitle the window, clear the screen, an 8-bit CSI


def test_recorded_text_cannot_drive_the_readers_terminal(tmp_path):
    """Commands, tasks, messages, replies, errors and sampled tokens are what agents and models wrote: `show`
    and `ls` print their control characters as \\xNN (no escape sequence reaches the terminal, and a
    recorded `[...]` is not rich markup)."""
    import io

    from rich.console import Console

    from polarproxy.store.records import CallResult, EpisodeStart
    from polarproxy.views import episodes_table, token_text

    db = tmp_path / "s.db"
    store = Store.open(db)
    ep = store.create_episode(
        EpisodeStart(command=["agent" + HOSTILE], task="t[bold]" + HOSTILE, group_id="g\t0\t" + HOSTILE)
    )
    conversation = {
        "messages": [
            {"role": "user", "content": "fix it" + HOSTILE},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "c", "name": "f" + HOSTILE, "arguments": "{}"}],
            },
            {"role": "tool", "content": "out\n" + HOSTILE, "tool_call_id": "c"},
        ],
        "tools": [],
        "sampling": {},
    }
    from factories import call_start

    start = call_start(
        ep, list(range(100, 110)), conversation=conversation, path="/v1/chat/completions?a=" + HOSTILE
    )
    cid, _ = store.begin_call(start)
    store.finish_call(
        cid,
        CallResult(
            status="failed",
            output_ids=[1, 2],
            output_logprobs=[-0.1, -0.2],
            error="boom" + HOSTILE,
            completion={"text": "answer" + HOSTILE, "tool_calls": [], "finish_reason": "stop"},
        ),
    )
    store.finish_episode(ep, status="failed", exit_code=1)
    episodes = store.list_episodes(limit=None)
    call = store.list_calls(ep)[0]
    store.close()

    printed = []
    for args in (["show", ep], ["show", ep, "--full"], ["ls"]):
        r = CliRunner().invoke(app, [*args, "--db", str(db)])
        assert r.exit_code == 0, r.output
        printed.append(r.stdout)
    as_json = CliRunner().invoke(app, ["show", ep, "--db", str(db), "--json"]).stdout
    assert "\x9b" not in as_json and "\x7f" not in as_json  # raw DEL and C1 (orjson escapes only C0)
    assert json.loads(as_json)["episode"]["command"] == ["agent" + HOSTILE]  # the same JSON
    sink = io.StringIO()
    console = Console(file=sink, force_terminal=True, color_system=None, width=200)  # a terminal, no colours
    console.print(episodes_table(episodes))
    console.print(token_text(call, lambda tid: HOSTILE if tid == 2 else "x"))
    printed.append(sink.getvalue())
    for out in printed:
        assert "\x1b" not in out and "\x9b" not in out and "\x07" not in out, repr(out)
    assert "\\x1b]0;pwned" in printed[0] and "fix it\\x1b" in printed[0] and "answer\\x1b" in printed[0]
    assert (
        "?a=\\x1b" in printed[0]
        and "boom\\x1b" in printed[0]
        and "f\\x1b" in printed[0]
        and "agent\\x1b" in printed[2]
    )
    assert len(printed[2].splitlines()[1].split("\t")) == 10  # a tab in a group is not a column of `ls`
    assert "t[bold]\\x1b" in printed[3] and "\\x9b31m" in printed[3]  # the markup shown as written
