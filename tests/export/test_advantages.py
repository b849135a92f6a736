"""GRPO and RLOO advantages against hand computations, for every scaling; groups whose rewards are all
equal dropped and counted (or kept); and the advantages in exported rows that validate against v2."""

from __future__ import annotations

import orjson
import pytest
from jsonschema import Draft202012Validator

from polarproxy.export import load_schema
from polarproxy.export.advantages import (
    AdvantageOptions,
    compute_advantages,
    group_key,
    grpo_advantages,
    population_std,
    rloo_advantages,
    sample_std,
)
from polarproxy.export.run import run_export
from polarproxy.store import CallResult, CallStart, EpisodeStart, Store
from polarproxy.store.records import Episode


def _ep(eid, reward, group=None, task=None, status="ok"):
    return Episode(eid, ["x"], None, None, task, group, reward, status, 0, 1.0, 2.0, {})


# Hand computations. Group [1, 0.5, 0]: mean 0.5, sample std sqrt((0.25 + 0 + 0.25) / 2) = 0.5 (population
# std sqrt(0.5 / 3) = 0.4082483). Group [1, 0, 0, 1]: mean 0.5, sample std sqrt(1 / 3) = 0.5773503
# (population 0.5). All seven rewards: mean 3.5 / 7 = 0.5, population std sqrt((3 * 0.25 + 0 + 3 * 0.25) / 7)
# = sqrt(1.5 / 7) = 0.4629100.
G1 = [1.0, 0.5, 0.0]
G2 = [1.0, 0.0, 0.0, 1.0]


def test_grpo_scaled_by_the_group_std_sample_by_default_as_verl_slime_and_trl():
    assert sample_std(G1) == pytest.approx(0.5, abs=1e-12)
    assert grpo_advantages(G1) == pytest.approx([0.5 / 0.500001, 0.0, -0.5 / 0.500001], abs=1e-6)
    a = 0.5 / (0.5773503 + 1e-6)
    assert grpo_advantages(G2) == pytest.approx([a, -a, -a, a], abs=1e-6)
    # torch.std (verl's, slime's and TRL's) is the sample std
    torch = pytest.importorskip("torch")
    assert sample_std(G2) == pytest.approx(torch.tensor(G2).std().item(), abs=1e-7)


def test_grpo_with_the_population_std():
    assert population_std(G1) == pytest.approx(0.4082483, abs=1e-7)
    assert grpo_advantages(G1, std_estimator="population") == pytest.approx(
        [0.5 / 0.4082493, 0.0, -0.5 / 0.4082493], abs=1e-6
    )
    # 0.5 / (0.5 + 1e-6) = 0.999998
    assert grpo_advantages(G2, std_estimator="population") == pytest.approx(
        [0.999998, -0.999998, -0.999998, 0.999998], abs=1e-6
    )
    with pytest.raises(ValueError, match=r"Unknown --std-estimator 'unbiased'.*'sample', 'population'"):
        AdvantageOptions("grpo", std_estimator="unbiased")


def test_grpo_scaled_by_the_batch_std_and_unscaled():
    assert grpo_advantages(G1, scale="batch", batch_std=0.46291) == pytest.approx(
        [0.5 / 0.462911, 0.0, -0.5 / 0.462911], abs=1e-6
    )
    assert grpo_advantages(G1, scale="none") == [0.5, 0.0, -0.5]  # Dr. GRPO: r - mean, no division
    with pytest.raises(ValueError, match="batch_std"):
        grpo_advantages(G1, scale="batch")


def test_rloo_subtracts_the_mean_of_the_other_episodes():
    # 1 - (0.5 + 0) / 2, 0.5 - (1 + 0) / 2, 0 - (1 + 0.5) / 2
    assert rloo_advantages(G1) == [0.75, 0.0, -0.75]
    assert rloo_advantages([2.0, 0.0]) == [2.0, -2.0]
    assert rloo_advantages([3.0]) == [0.0]


def test_groups_by_group_then_task_then_episode():
    assert group_key(_ep("ep_a", 1, group="g", task="t")) == "group:g"
    assert group_key(_ep("ep_b", 1, task="t")) == "task:t"
    assert group_key(_ep("ep_c", 1)) == "episode:ep_c"


def _episodes():
    eps = [_ep(f"ep_g1{i}", r, group="g1") for i, r in enumerate(G1)]
    eps += [_ep(f"ep_g2{i}", r, group="g2") for i, r in enumerate(G2)]
    eps += [_ep("ep_flat0", 1.0, group="flat"), _ep("ep_flat1", 1.0, group="flat", status="failed")]
    eps += [_ep("ep_alone", 0.3), _ep("ep_unrewarded", None, group="g1")]
    return eps


def test_batch_std_is_over_every_rewarded_episode_of_the_export():
    report = compute_advantages(_episodes(), AdvantageOptions("grpo", "batch"))
    rewards = [*G1, *G2, 1.0, 1.0, 0.3]
    assert report.batch_std == pytest.approx(sample_std(rewards))
    population = compute_advantages(
        _episodes(), AdvantageOptions("grpo", "batch", std_estimator="population")
    )
    assert population.batch_std == pytest.approx(population_std(rewards))
    assert report.advantages["ep_g10"] == pytest.approx((1.0 - 0.5) / (report.batch_std + 1e-6))


def test_zero_variance_groups_and_episodes_without_reward_are_left_out_and_counted():
    report = compute_advantages(_episodes(), AdvantageOptions("grpo"))
    assert sorted(report.advantages) == sorted(
        [f"ep_g1{i}" for i in range(3)] + [f"ep_g2{i}" for i in range(4)]
    )
    assert report.advantages["ep_g20"] == pytest.approx(0.5 / (0.5773503 + 1e-6))
    assert report.zero_variance_groups == ["episode:ep_alone", "group:flat"]
    assert report.zero_variance_episodes == 3 and report.episodes_without_reward == ["ep_unrewarded"]
    assert report.summary()["groups"] == 4
    kept = compute_advantages(_episodes(), AdvantageOptions("rloo", keep_zero_variance=True))
    assert kept.advantages["ep_flat0"] == kept.advantages["ep_flat1"] == kept.advantages["ep_alone"] == 0.0
    assert kept.advantages["ep_g10"] == 0.75  # a failed episode with a reward counts like any other
    assert kept.zero_variance_episodes == 3 and kept.summary()["zero_variance_kept"] is True
    assert "ep_unrewarded" not in kept.advantages


def _recorded_groups(db):
    """Three episodes of group g (rewards 1, 0, and none), two of task t without a group (0.5, 0.5)."""
    store = Store.open(db)
    made = {}
    for name, group, task, reward in (
        ("g_hi", "g", "t", 1.0),
        ("g_lo", "g", "t", 0.0),
        ("g_none", "g", "t", None),
        ("t_a", None, "t", 0.5),
        ("t_b", None, "t", 0.5),
    ):
        eid = store.create_episode(EpisodeStart(command=[name], task=task, group_id=group))
        cid, _ = store.begin_call(
            CallStart(
                eid, "openai_chat", "POST", "/v1/chat/completions", "m", False, {}, "{}", None, [1, 2, 3]
            )
        )
        store.finish_call(
            cid,
            CallResult(status="ok", output_ids=[4, 5], output_logprobs=[-0.5, -0.25], weight_version="w1"),
        )
        if reward is not None:
            store.set_reward(eid, reward)
        made[name] = eid
    return store, made


def test_an_export_with_advantages_writes_them_per_row_and_counts_what_it_left_out(tmp_path):
    store, made = _recorded_groups(tmp_path / "a.db")
    validator = Draft202012Validator(load_schema("export-row.v3"))
    out = tmp_path / "grpo.jsonl"
    summary = run_export(store, out, advantages=AdvantageOptions("grpo"))
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    for row in rows:
        validator.validate(row)
    by_episode = {r["episode_id"]: r for r in rows}
    assert set(by_episode) == {made["g_hi"], made["g_lo"]}
    std = 0.5**0.5  # the sample std of [1, 0]
    assert by_episode[made["g_hi"]]["advantage"] == pytest.approx(0.5 / (std + 1e-6))
    assert by_episode[made["g_lo"]]["advantage"] == pytest.approx(-0.5 / (std + 1e-6))
    assert by_episode[made["g_hi"]]["metadata"]["advantage_group"] == "group:g"
    assert summary["advantages"] == {
        "estimator": "grpo",
        "scale_rewards": "group",
        "std_estimator": "sample",
        "excluded_failed": 0,
        "failed_as_zero": 0,
        "groups": 2,
        "episodes": 2,
        "episodes_without_reward": 1,
        "zero_variance_groups": 1,
        "zero_variance_episodes": 2,
        "zero_variance_kept": False,
        "batch_std": None,
        "rows_dropped": 3,
    }
    assert summary["rows"] == 2 and summary["episodes"] == 5

    summary = run_export(store, out, advantages=AdvantageOptions("rloo", keep_zero_variance=True))
    rows = {r["episode_id"]: r for r in map(orjson.loads, out.read_bytes().splitlines())}
    assert (
        rows[made["t_a"]]["advantage"] == 0.0 and rows[made["t_a"]]["metadata"]["advantage_group"] == "task:t"
    )
    assert rows[made["g_hi"]]["advantage"] == 1.0 and summary["advantages"]["rows_dropped"] == 1

    run_export(store, out)  # without advantages: every row, advantage null
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert len(rows) == 5 and all(r["advantage"] is None for r in rows)
    assert all(r["weight_versions"] == ["w1"] and r["mixed_weight_versions"] == [False] for r in rows)
    store.close()
