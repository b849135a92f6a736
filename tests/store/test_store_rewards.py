"""Rewards, groups and per-call sampling facts in the store, on SQLite and PostgreSQL: where each reward came
from, per-call overrides, the episode filters of `ls`/`export`, and the m005 upgrade of a database with rows."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import create_engine, inspect, text

from polarproxy.store import EpisodeStart, NotFoundError, Store
from polarproxy.store import migrations as mig
from polarproxy.store.query import EpisodeQuery
from polarproxy.store.records import RewardOrigin
from polarproxy.store.urls import sqlalchemy_url


def _calls(store, episode_id, call_start, ok_result, n, **start_kw):
    for _ in range(n):
        cid, _seq = store.begin_call(call_start(episode_id, **start_kw))
        store.finish_call(cid, ok_result())


def test_episode_and_call_rewards_are_set_and_their_origin_recorded(store, episode, call_start, ok_result):
    _calls(store, episode, call_start, ok_result, 3)
    origin = RewardOrigin(
        source="command",
        command=["/bin/sh", "-c", "pytest -q"],
        exit_code=1,
        output_tail="1 failed",
        note="exit",
    )
    store.set_rewards(episode, episode=0.0, calls={2: 1.0}, origin=origin)
    store.set_reward(episode, 0.5, call=0)  # `polarproxy reward EP 0.5 --call 0`
    assert store.get_episode(episode).reward == 0.0
    assert [c.reward for c in store.list_calls(episode)] == [0.5, None, 1.0]
    records = store.list_rewards(episode)
    assert [(r.call_seq, r.reward, r.origin.source) for r in records] == [
        (None, 0.0, "command"),
        (2, 1.0, "command"),
        (0, 0.5, "cli"),
    ]
    assert records[0].origin == origin and records[0].call_id is None
    assert records[1].call_id == store.list_calls(episode)[2].id
    assert all(r.created_at > 0 for r in records)


def test_a_reward_for_a_missing_call_or_episode_writes_nothing(store, episode, call_start, ok_result):
    _calls(store, episode, call_start, ok_result, 2)
    with pytest.raises(NotFoundError, match=r"has no call #5; it has calls 0\.\.1"):
        store.set_rewards(episode, episode=1.0, calls={5: 1.0}, origin=RewardOrigin(source="http"))
    assert store.get_episode(episode).reward is None and store.list_rewards(episode) == []
    with pytest.raises(NotFoundError, match="No episode 'ep_nope'"):
        store.set_reward("ep_nope", 1.0)
    for bad in (math.nan, math.inf, True, "1"):
        with pytest.raises(ValueError, match="not a finite number"):
            store.set_reward(episode, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Unknown reward source 'mail'"):
        store.set_reward(episode, 1.0, origin=RewardOrigin(source="mail"))  # type: ignore[arg-type]


def test_temperature_and_first_and_last_weight_versions_are_recorded(store, episode, call_start, ok_result):
    asked = call_start(episode, conversation={"messages": [], "tools": [], "sampling": {"temperature": 0.7}})
    cid, _ = store.begin_call(asked)
    store.finish_call(
        cid, ok_result(weight_version="w2", weight_version_first="w1", weight_version_last="w2")
    )
    explicit = call_start(episode, temperature=1.25)  # the gateway's own value wins over the request's
    cid2, _ = store.begin_call(explicit)
    store.finish_call(cid2, ok_result(weight_version="w2"))
    cid3, _ = store.begin_call(call_start(episode))  # the request set none: the backend's default
    store.finish_call(
        cid3, ok_result(weight_version="w2", weight_version_first="w2", weight_version_last="w2")
    )
    calls = store.list_calls(episode)
    assert [c.temperature for c in calls] == [0.7, 1.25, None]
    assert [(c.weight_version_first, c.weight_version_last) for c in calls] == [
        ("w1", "w2"),
        (None, None),
        ("w2", "w2"),
    ]
    assert [c.mixed_weight_versions for c in calls] == [True, False, False]


def test_episodes_are_filtered_by_task_group_status_harness_time_and_reward(store):
    made = {}
    for name, task, group, harness in (
        ("a", "t1", "g1", "pi"),
        ("b", "t1", "g1", "codex"),
        ("c", "t2", None, "pi"),
    ):
        made[name] = store.create_episode(
            EpisodeStart(command=[name], task=task, group_id=group, harness=harness)
        )
    store.finish_episode(made["a"], status="ok", exit_code=0)
    store.set_reward(made["a"], 1.0)
    store.set_reward(made["b"], 0.25)

    def ids(**kw):
        return sorted(e.id for e in store.list_episodes(limit=None, where=EpisodeQuery(**kw)))

    assert ids(task="t1") == sorted([made["a"], made["b"]])
    assert ids(group_id="g1", harness="pi") == [made["a"]]
    assert ids(status="ok") == [made["a"]]
    assert ids(min_reward=0.5) == [made["a"]]
    assert ids(min_reward=0.0) == sorted([made["a"], made["b"]])  # no reward never passes
    assert ids(since=store.get_episode(made["c"]).started_at) == [made["c"]]
    assert ids(episode_ids=[made["b"], made["c"]], task="t2") == [made["c"]]
    assert ids() == sorted(made.values())
    with pytest.raises(ValueError, match="Unknown episode status 'good'"):
        EpisodeQuery(status="good")


def test_deleting_an_episode_deletes_its_reward_records(store, episode, call_start, ok_result):
    from polarproxy.store.maintenance import delete_episodes

    _calls(store, episode, call_start, ok_result, 1)
    store.set_reward(episode, 1.0, call=0)
    assert delete_episodes(store, [episode]) == 1
    assert store.list_rewards(episode) == []


def _engine(url: str):
    return create_engine(sqlalchemy_url(url) if "://" in url else f"sqlite:///{url}")


def test_upgrade_from_m004_keeps_rows_and_adds_rewards_and_sampling(
    store_url, monkeypatch, call_start, ok_result
):
    """A database written before m005, with an episode and a call in it, is upgraded in place: the old call
    reads back (its temperature from its request), and rewards and the new columns work on it."""
    before = [fn for fn in mig.MIGRATIONS if fn.__name__ < "m005"]
    assert [fn.__name__ for fn in mig.MIGRATIONS][len(before)] == "m005_rewards_and_sampling"
    with monkeypatch.context() as m:
        m.setattr(mig, "MIGRATIONS", before)
        Store.open(store_url).close()
    engine = _engine(store_url)
    assert "rewards" not in inspect(engine).get_table_names()
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO episodes (id, command_json, status, started_at, metadata_json, next_seq, task, "
                "group_id, reward) VALUES ('ep_old', '[\"agent\"]', 'ok', 1000.0, '{}', 1, 't', 'g', 0.5)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO calls (id, episode_id, seq, dialect, method, path, model, stream, status, "
                "request_headers_json, request_body, conversation_json, prompt_tail_ids, prompt_len, output_ids, "
                "output_logprobs, output_len, backend, backend_kind, fidelity, render_mode, started_at, "
                "weight_version) VALUES ('call_old', 'ep_old', 0, 'openai_chat', 'POST', '/v1/chat/completions', "
                "'m', :f, 'ok', '{}', '{}', :conv, :e, 0, :e, :e, 0, 'b', 'sglang', 'tokens', 'fresh', 1000.0, 'w0')"
            ),
            {"f": False, "e": b"", "conv": '{"messages": [], "tools": [], "sampling": {"temperature": 0.6}}'},
        )
    engine.dispose()
    with Store.open(store_url) as upgraded:
        (old,) = upgraded.list_calls("ep_old")
        assert (old.temperature, old.weight_version, old.weight_version_first, old.mixed_weight_versions) == (
            0.6,
            "w0",
            None,
            False,
        )
        assert upgraded.get_episode("ep_old").reward == 0.5
        upgraded.set_reward("ep_old", 1.0, call=0, origin=RewardOrigin(source="http"))
        assert upgraded.list_calls("ep_old")[0].reward == 1.0
        assert [r.origin.source for r in upgraded.list_rewards("ep_old")] == ["http"]
        assert [e.id for e in upgraded.list_episodes(where=EpisodeQuery(task="t", group_id="g"))] == [
            "ep_old"
        ]
        cid, seq = upgraded.begin_call(call_start("ep_old", temperature=0.9))
        upgraded.finish_call(cid, ok_result(weight_version_first="w0", weight_version_last="w1"))
        new = upgraded.get_call(cid)
        assert (seq, new.temperature, new.mixed_weight_versions) == (1, 0.9, True)
    with Store.open(store_url) as again:
        assert mig.migrate(again.engine) == []


def test_a_graded_reward_keeps_the_agents_diff_and_the_tests_bounded(store, episode):
    from polarproxy.store.rewards import MAX_GRADING_TESTS, MAX_PATCH_CHARS

    tests = {f"tests/test_x.py::test_{i}": "PASSED" for i in range(MAX_GRADING_TESTS + 3)}
    grading = {"resolved": True, "parser": "pytest -rA", "tests": tests}
    patch = "diff --git a/x b/x\n+\u00e9\x00\n" + "+" * MAX_PATCH_CHARS
    store.set_rewards(
        episode, episode=1.0, origin=RewardOrigin(source="command", patch=patch, grading=grading)
    )
    (r,) = store.list_rewards(episode)
    kept = r.origin.grading
    assert kept["resolved"] is True and kept["parser"] == "pytest -rA" and kept["tests_not_stored"] == 3
    assert list(kept["tests"]) == list(tests)[:MAX_GRADING_TESTS]
    assert r.origin.patch.startswith("diff --git a/x b/x\n+\u00e9") and r.origin.patch.endswith(
        f"[patch cut: {len(patch) - MAX_PATCH_CHARS} more characters not stored]\n"
    )
    store.set_reward(episode, 0.0)  # a reward set by hand has neither
    assert (store.list_rewards(episode)[-1].origin.patch, store.list_rewards(episode)[-1].origin.grading) == (
        None,
        None,
    )
