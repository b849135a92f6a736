"""`export --format slime|verl|trl|nemo-rl|openrlhf` on real recorded episodes (examples/tool_agent.py run
under `polarproxy record` against the local backend: three streamed calls with tool outputs between them,
prefix-merged into one sequence), one of them given two sub-agent branches. Each file is read back as its
trainer reads it (the contract in docs/trainers.md: field names, lengths, 0.0 logprobs outside the
sampled tokens), the trajectory is rebuilt from it and compared with `--format jsonl`'s row of the same
calls token by token, and T4 is checked against the store: the trainable tokens are exactly the sampled
tokens of the row's calls, with their logprobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from factories import TWO_GROUPS, call_start
from factories import record_tool_agent as _record

from polarproxy.store import CallResult, EpisodeStart, Store

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def _branch(store: Store, episode_id: str) -> list[str]:
    """Two sub-agent calls that extend the episode's first call (a branched episode: three leaf paths)."""
    first = store.list_calls(episode_id)[0]
    base = list(first.prompt_ids) + list(first.output_ids)
    ids = []
    for tail, out in (([40, 41], [42, 43, 44]), ([50], [51, 52])):
        start = call_start(
            episode_id,
            base + tail,
            model=first.model,
            conversation={"messages": [{"role": "user", "content": "sub"}], "tools": [], "sampling": {}},
            render_mode="extended",
            extended_from=first.id,
            logprob_temperature=1.0,
        )
        call_id, _ = store.begin_call(start)
        logprobs = [-0.25 - i / 16 for i in range(len(out))]
        store.finish_call(call_id, CallResult(status="ok", output_ids=out, output_logprobs=logprobs))
        ids.append(call_id)
    return ids


def _copy(
    store: Store, source: str, group: str, calls: int, reward: float, *, temperature: float | None = None
) -> str:
    """A new episode of `group` holding the first `calls` calls of a recorded one (its tokens and logprobs,
    or with `temperature` as sampled and scored at it), finished with `reward`."""
    eid = store.create_episode(EpisodeStart(command=["agent"], task=f"task-{group}", group_id=group))
    previous = None
    for call in store.list_calls(source)[:calls]:
        start = call_start(
            eid,
            list(call.prompt_ids),
            model=call.model,
            stream=call.stream,
            conversation=call.conversation,
            render_mode=call.render_mode,
            extended_from=previous,
            temperature=temperature,
            logprob_temperature=temperature or call.logprob_temperature,
        )
        previous, _ = store.begin_call(start)
        result = CallResult(
            status="ok",
            output_ids=list(call.output_ids),
            output_logprobs=list(call.output_logprobs),
            completion=call.completion,
            finish_reason=call.finish_reason,
            weight_version=call.weight_version,
        )
        store.finish_call(previous, result)
    store.finish_episode(eid, status="ok", exit_code=0)
    store.set_reward(eid, reward)
    return eid


@pytest.fixture(scope="module")
def recorded(backend, tiny_model_dir, tmp_path_factory):
    ws = tmp_path_factory.mktemp("ws")
    (ws / "README.md").write_text("# Sample\n\nA sample project.\n")
    (ws / "main.py").write_text("print('hi')\n")
    db = tmp_path_factory.mktemp("db") / "rec.db"
    episodes = {
        (g, i): _record(backend.url, tiny_model_dir, db, ws, g, r)
        for g, rs in TWO_GROUPS.items()
        for i, r in enumerate(rs)
    }
    with Store.open(str(db)) as store:
        _branch(store, episodes[("g1", 0)])
        hot = _copy(store, episodes[("g2", 0)], "hot", 1, 1.0, temperature=0.6)  # logprobs at T = 0.6
        short = _copy(store, episodes[("g2", 0)], "uneven", 1, 1.0)  # solved in one call
        long = _copy(store, episodes[("g2", 1)], "uneven", 3, 0.0)
    episodes[("uneven", 0)], episodes[("uneven", 1)] = short, long
    return db, episodes, hot


def _export(db: Path, out: Path, fmt: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "polarproxy", "export", "--db", str(db), "--out", str(out), "--format", fmt]
    return subprocess.run([*argv, "--json", *args], capture_output=True, text=True, timeout=300, cwd=REPO)


def _ok(res: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


def _episodes(*ids: str) -> list[str]:
    return [a for e in ids for a in ("--episode", e)]


def _reference(db: Path, tmp: Path, *args: str) -> dict[tuple[str, ...], dict[str, Any]]:
    """`--format jsonl`'s rows of the same export, by their calls."""
    out = tmp / "reference.jsonl"
    _ok(_export(db, out, "jsonl", "--strategy", "prefix-merge", "--advantages", "grpo", *args))
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    return {tuple(r["call_ids"]): r for r in rows}


def _same_as_reference(
    ref: dict[str, Any], ids: list[int], mask: list[int], logprobs: list[float], store: Store
) -> None:
    """One rebuilt trajectory against the JSONL row of its calls, and T4 against the store."""
    assert ids == ref["input_ids"] and mask == ref["loss_mask"]
    assert len(logprobs) == len(ids)
    for m, lp, want in zip(mask, logprobs, ref["logprobs"], strict=True):
        assert (lp == want) if m else (lp == 0.0 and want is None)
    sampled = [t for t, m in zip(ids, mask, strict=True) if m]
    calls = {c.id: c for c in store.list_calls(ref["episode_id"])}
    assert sampled == [t for c in ref["call_ids"] for t in calls[c].output_ids]  # T4
    scored = [lp for lp, m in zip(logprobs, mask, strict=True) if m]
    assert np.array_equal(
        np.float32(scored), np.float32([x for c in ref["call_ids"] for x in calls[c].output_logprobs])
    )


def test_openrlhf_verl_and_nemo_rl_rows_are_the_jsonl_rows_in_their_trainers_names(recorded, tmp_path):
    pa = pytest.importorskip("pyarrow.parquet")
    db, episodes, _hot = recorded
    chosen = _episodes(*episodes.values())
    ref = _reference(db, tmp_path, *chosen)
    assert (
        len(ref) == 8
    )  # 6 linear episodes, and the branched one's two more leaf paths  # 4 linear episodes, and the branched one's two more leaf paths
    with Store.open(str(db)) as store:
        summary = _ok(_export(db, tmp_path / "o.jsonl", "openrlhf", *chosen))
        assert summary["strategy"] == "prefix-merge" and summary["advantages"]["estimator"] == "grpo"
        lines = [orjson.loads(x) for x in (tmp_path / "o.jsonl").read_bytes().splitlines()]
        assert len(lines) == len(ref) == summary["rows"]
        for line in lines:
            r = ref[tuple(line["polarproxy"]["call_ids"])]
            obs, ranges = line["observation_tokens"], line["action_ranges"]
            mask = [0] * len(obs)
            for a, b in ranges:
                assert 0 <= a < b <= len(obs)
                mask[a:b] = [1] * (b - a)
            _same_as_reference(r, obs, mask, line["rollout_log_probs"], store)
            assert line["reward"] == r["reward"] and line["advantage"] == r["advantage"]
            assert line["truncated"] is False
            versions = {v for v in r["weight_versions"] if v is not None}  # the sub-agent calls have none
            assert versions <= {"default"}
            assert (
                line["min_weight_version"]
                == line["max_weight_version"]
                == (versions.pop() if versions else None)
            )
            assert line["group_id"] == r["metadata"]["advantage_group"]

        _ok(_export(db, tmp_path / "v.parquet", "verl", *chosen))
        table = pa.read_table(tmp_path / "v.parquet").to_pylist()
        assert len(table) == len(ref)
        uids = {}
        for row in table:
            extra = json.loads(row["polarproxy"])
            r = ref[tuple(extra["call_ids"])]
            prompt, response = row["prompt_ids"], row["response_ids"]
            assert len(row["response_mask"]) == len(row["response_logprobs"]) == len(response)
            assert row["response_mask"][0] == 1  # the response starts at the first sampled token
            mask = [0] * len(prompt) + row["response_mask"]
            logprobs = [0.0] * len(prompt) + row["response_logprobs"]
            _same_as_reference(r, prompt + response, mask, logprobs, store)
            assert row["reward_score"] == r["reward"] and row["advantage"] == pytest.approx(r["advantage"])
            assert row["num_turns"] == len(r["call_ids"]) + 1
            uids.setdefault(r["episode_id"], set()).add(row["uid"])
        branched = episodes[("g1", 0)]
        assert len(uids[branched]) == 1  # the branched episode's leaf paths share their group's uid

        _ok(_export(db, tmp_path / "n.jsonl", "nemo-rl", *chosen))
        lines = [orjson.loads(x) for x in (tmp_path / "n.jsonl").read_bytes().splitlines()]
        assert len(lines) == len(episodes)  # one line per episode
        segments = 0
        for line in lines:
            for seg in line["rollout_details"]:
                segments += 1
                r = ref[tuple(seg["extra"]["call_id"])]
                ids: list[int] = []
                mask: list[int] = []
                logprobs: list[float] = []
                turns = zip(
                    seg["prompt_token_ids"], seg["completion_token_ids"], seg["logprobs"], strict=True
                )
                for prompt, completion, lps in turns:
                    assert len(completion) == len(lps)
                    assert prompt[: len(ids)] == ids  # each turn's prompt extends what came before
                    new = prompt[len(ids) :]
                    ids += new + completion
                    mask += [0] * len(new) + [1] * len(completion)
                    logprobs += [0.0] * len(new) + lps
                _same_as_reference(r, ids, mask, logprobs, store)
                assert line["reward"] == r["reward"]
        assert segments == len(ref)


def test_trl_rows_are_one_per_episode_in_groups_of_one_size(recorded, tmp_path):
    db, episodes, _hot = recorded
    linear = [e for k, e in episodes.items() if k != ("g1", 0)]
    # the branched episode has three rows: TRL cannot take it, and the error names it
    res = _export(db, tmp_path / "t.jsonl", "trl", *_episodes(*episodes.values()))
    assert res.returncode == 1 and episodes[("g1", 0)] in res.stderr and "one row per episode" in res.stderr
    assert not (tmp_path / "t.jsonl").exists()
    # g1 then has one episode and g2 two: groups of two sizes, named
    res = _export(db, tmp_path / "t.jsonl", "trl", "--advantages", "none", *_episodes(*linear))
    assert res.returncode == 1 and "group:g1" in res.stderr and "groups of one size" in res.stderr
    # complete groups only: g2, whose advantages are ±(1/√2) with the sample std
    g2 = [episodes[("g2", 0)], episodes[("g2", 1)]]
    ref = _reference(db, tmp_path, *_episodes(*g2))
    _ok(_export(db, tmp_path / "t.jsonl", "trl", *_episodes(*g2)))
    lines = [orjson.loads(x) for x in (tmp_path / "t.jsonl").read_bytes().splitlines()]
    assert len(lines) == 2 and {x["group_id"] for x in lines} == {"group:g2"}
    with Store.open(str(db)) as store:
        for line in lines:
            r = ref[tuple(line["polarproxy"]["call_ids"])]
            n = len(line["completion_ids"])
            assert len(line["logprobs"]) == len(line["env_mask"]) == n and line["env_mask"][0] == 1
            mask = [0] * len(line["prompt_ids"]) + line["env_mask"]
            logprobs = [0.0] * len(line["prompt_ids"]) + line["logprobs"]
            _same_as_reference(r, line["prompt_ids"] + line["completion_ids"], mask, logprobs, store)
            assert 0 in line["env_mask"]  # the tool outputs between the calls are the environment's
    assert sorted(x["advantage"] for x in lines) == pytest.approx([-(0.5**0.5), 0.5**0.5], abs=1e-5)


def test_slime_files_hold_samples_per_step_of_complete_groups(recorded, tmp_path):
    torch = pytest.importorskip("torch")
    db, episodes, _hot = recorded
    chosen = _episodes(*episodes.values())
    ref = _reference(db, tmp_path, *chosen)
    _ok(_export(db, tmp_path / "all.pt", "slime", *chosen))
    one = torch.load(tmp_path / "all.pt", weights_only=False)
    assert one["rollout_id"] == 0 and len(one["samples"]) == len(ref)
    steps = tmp_path / "steps"
    steps.mkdir()
    summary = _ok(_export(db, steps / "{rollout_id}.pt", "slime", "--groups-per-file", "1", *chosen))
    assert summary["files"] == [str(steps / f"{i}.pt") for i in range(3)]  # g1, g2, uneven
    with Store.open(str(db)) as store:
        seen_groups = []
        for i, path in enumerate(summary["files"]):
            umask = os.umask(0)
            os.umask(umask)
            assert (
                os.stat(path).st_mode & 0o777 == 0o666 & ~umask
            )  # as open() makes a file: a trainer reads it
            data = torch.load(path, weights_only=False)
            assert data["rollout_id"] == i
            groups = {s["group_index"] for s in data["samples"]}
            assert len(groups) == 1  # one complete group per step
            seen_groups += groups
            by_episode: dict[int, set[str]] = {}
            for s in data["samples"]:
                extra = s["metadata"]["polarproxy"]
                r = ref[tuple(extra["call_ids"])]
                n = s["response_length"]
                assert len(s["loss_mask"]) == len(s["rollout_log_probs"]) == n and s["loss_mask"][0] == 1
                p = len(s["tokens"]) - n
                _same_as_reference(
                    r, s["tokens"], [0] * p + s["loss_mask"], [0.0] * p + s["rollout_log_probs"], store
                )
                assert s["reward"] == r["reward"] and s["metadata"]["advantage"] == r["advantage"]
                assert s["status"] == "completed"
                assert s["weight_versions"] == [v for v in r["weight_versions"] if v is not None]
                by_episode.setdefault(s["rollout_id"], set()).add(extra["episode_id"])
            assert all(len(eps) == 1 for eps in by_episode.values())  # one rollout_id per episode
        assert sorted(seen_groups) == [0, 1, 2]
        assert sorted(s["index"] for s in one["samples"]) == list(range(len(ref)))


def test_a_mix_of_logprob_temperatures_is_refused_where_the_trainer_assumes_one(recorded, tmp_path):
    db, episodes, hot = recorded
    chosen = _episodes(episodes[("g2", 0)], episodes[("g2", 1)], hot)
    for fmt, out in (("verl", "v.parquet"), ("slime", "s.pt")):
        res = _export(db, tmp_path / out, fmt, "--advantages", "none", *chosen)
        assert res.returncode == 1, res.stderr
        assert "more than one temperature" in res.stderr and "0.6" in res.stderr and fmt in res.stderr
        assert not (tmp_path / out).exists()
    # a format that carries the temperature per call takes them
    _ok(_export(db, tmp_path / "o.jsonl", "openrlhf", "--advantages", "none", *chosen))
    temps = [
        orjson.loads(x)["polarproxy"]["logprob_temperatures"]
        for x in (tmp_path / "o.jsonl").read_bytes().splitlines()
    ]
    assert sorted({t for ts in temps for t in ts}) == [0.6, 1.0]


def test_rows_without_token_ids_are_refused_and_bad_options_are_usage_errors(recorded, tmp_path):
    db, _episodes, _hot = recorded
    with Store.open(str(db)) as store:
        eid = store.create_episode(EpisodeStart(command=["chat"], task="text-only"))
        conversation = {"messages": [{"role": "user", "content": "hi"}], "tools": [], "sampling": {}}
        start = call_start(eid, [], model="gpt-5", fidelity="text", conversation=conversation)
        cid, _ = store.begin_call(start)
        store.finish_call(cid, CallResult(status="ok", output_ids=[], completion={"text": "hello"}))
    for fmt in ("openrlhf", "verl", "trl", "nemo-rl", "slime"):
        res = _export(db, tmp_path / f"x.{fmt}", fmt, "--advantages", "none", "--episode", eid)
        assert res.returncode == 1 and "fidelity text" in res.stderr and eid in res.stderr, (fmt, res.stderr)
        assert "Traceback" not in res.stderr and not (tmp_path / f"x.{fmt}").exists()
    res = _export(db, tmp_path / "x.jsonl", "openrlhf", "--jobs", "2")
    assert res.returncode == 2 and "--jobs" in res.stderr
    res = _export(db, tmp_path / "x.jsonl", "openrlhf", "--groups-per-file", "2")
    assert res.returncode == 2 and "{rollout_id}" in res.stderr
    res = _export(db, tmp_path / "x.jsonl", "trl", "--tokenizer", str(tmp_path))
    assert res.returncode == 2 and "--tokenizer" in res.stderr


def _uneven_first_step(recorded, fmt: str, out: Path, tiny_model_dir: Path, tmp_path: Path) -> dict:
    """The `uneven` group (rows of two lengths: a loss that is not 0) exported as `fmt` to `out`, and
    `polarproxy train`'s first-step metrics on the same episodes' jsonl rows (--lr 0, token-mean), with the
    advantages each trainer computes as we do (grpo, no std division)."""
    from polarproxy.train.metrics import read_metrics

    db, episodes, _hot = recorded
    chosen = _episodes(episodes[("uneven", 0)], episodes[("uneven", 1)])
    adv = ("--advantages", "grpo", "--scale-rewards", "none")
    _ok(_export(db, out, fmt, *adv, *chosen))
    _ok(_export(db, tmp_path / "rows.jsonl", "jsonl", "--strategy", "prefix-merge", *adv, *chosen))
    train = [sys.executable, "-m", "polarproxy", "train", "--data", str(tmp_path / "rows.jsonl")]
    train += ["--model", str(tiny_model_dir), "--out", str(tmp_path / "pp"), "--steps", "1", "--lr", "0"]
    train += ["--device", "cpu", "--rows-per-step", "2", "--loss-agg", "token-mean"]
    res = subprocess.run(train, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    return read_metrics(tmp_path / "pp")[0]


def test_trls_own_grpo_step_on_the_replayed_rows_gives_polarproxy_trains_loss(
    recorded, tiny_model_dir, tmp_path
):
    """TRL 1.16's GRPOTrainer, fed the `trl` rows through polarproxy/integrations/trl_replay.py (TRL computes
    its advantages from the recorded rewards: scale_rewards none), and `polarproxy train` on the same
    episodes' jsonl rows (--advantages grpo --scale-rewards none): the first step's loss is the same."""
    pytest.importorskip("trl")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from polarproxy.integrations.trl_replay import TrlReplay, recorded_reward

    ours = _uneven_first_step(recorded, "trl", tmp_path / "t.jsonl", tiny_model_dir, tmp_path)

    replay = TrlReplay(tmp_path / "t.jsonl")
    assert replay.num_generations == 2
    config = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=2,
        num_generations=replay.num_generations,
        max_steps=1,
        learning_rate=0.0,
        beta=0.0,
        scale_rewards="none",
        loss_type="dapo",
        max_completion_length=4096,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        seed=0,
    )
    trainer = GRPOTrainer(
        model=str(tiny_model_dir),
        reward_funcs=recorded_reward,
        args=config,
        train_dataset=Dataset.from_list(replay.dataset()),
        rollout_func=replay,
    )
    trainer.train()
    logged = next(h for h in trainer.state.log_history if "loss" in h)
    assert abs(ours["loss"]) > 0.01 and ours["trainable_tokens"] > logged["completions/min_length"]
    assert logged["loss"] == pytest.approx(ours["loss"], abs=1e-5), (logged, ours)


def test_the_verl_replay_and_slime_advantage_pieces_read_the_exported_files(recorded, tmp_path):
    """What can run here without verl and slime (neither installs on this CPU machine): the replay agent
    loop's rows and dataset, the batch verl pads them into (prompts left, responses right, the reward on the
    last response token), and slime's reward post-process giving polarproxy's advantages."""
    torch = pytest.importorskip("torch")
    pq = pytest.importorskip("pyarrow.parquet")
    from polarproxy.integrations.slime_advantages import reward_post_process
    from polarproxy.integrations.verl_replay import (
        GROUP_FIELD,
        Replay,
        output_fields,
        pad_batch,
        write_dataset,
    )

    db, episodes, _hot = recorded
    chosen = _episodes(*(e for k, e in episodes.items() if k[0] != "uneven"))
    ref = _reference(db, tmp_path, *chosen)
    _ok(_export(db, tmp_path / "v.parquet", "verl", *chosen))
    n = write_dataset(tmp_path / "v.parquet", tmp_path / "train.parquet")
    dataset = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert n == 4  # g1: the branched episode's three leaf paths and the other episode
    assert {d[GROUP_FIELD] for d in dataset} == {"group:g1", "group:g2"}
    assert all(d["agent_name"] == "polarproxy_replay" for d in dataset)
    replay = Replay(tmp_path / "v.parquet")
    rows = [replay.next("group:g1") for _ in range(n + 1)]
    assert rows[n] == rows[0]  # a new epoch starts over
    assert len({json.loads(r["polarproxy"])["call_ids"][0] for r in rows[:n]}) == n
    outputs = [output_fields(r) for r in rows[:n]]
    assert set(outputs[0]) == {"prompt_ids", "response_ids", "response_mask", "response_logprobs"} | {
        "reward_score",
        "num_turns",
    }
    longest_prompt = max(len(o["prompt_ids"]) for o in outputs)
    longest_response = max(len(o["response_ids"]) for o in outputs)
    batch = pad_batch(outputs, longest_prompt + 3, longest_response + 5, pad_token_id=-1)
    assert batch["input_ids"].shape == (n, longest_prompt + 3 + longest_response + 5)
    with Store.open(str(db)) as store:
        for i, (o, row) in enumerate(zip(outputs, rows, strict=False)):
            p, r = len(o["prompt_ids"]), len(o["response_ids"])
            assert (batch["prompts"][i, : longest_prompt + 3 - p] == -1).all()  # left-padded
            assert (batch["responses"][i, r:] == -1).all() and (batch["rollout_log_probs"][i, r:] == 0).all()
            real = batch["attention_mask"][i].astype(bool)
            assert batch["position_ids"][i][real].tolist() == list(range(p + r))
            ids = batch["input_ids"][i][real].tolist()
            mask = [0] * p + batch["response_mask"][i, :r].tolist()
            logprobs = [0.0] * p + [float(x) for x in batch["rollout_log_probs"][i, :r]]
            reference = ref[tuple(json.loads(row["polarproxy"])["call_ids"])]
            reference = {
                **reference,
                "logprobs": [None if x is None else float(np.float32(x)) for x in reference["logprobs"]],
            }
            _same_as_reference(reference, ids, mask, logprobs, store)
            assert (
                batch["rm_scores"][i, r - 1] == reference["reward"]
                and batch["rm_scores"][i].sum() == reference["reward"]
            )

    _ok(_export(db, tmp_path / "s.pt", "slime", *chosen))
    samples = torch.load(tmp_path / "s.pt", weights_only=False)["samples"]
    raw, advantages = reward_post_process(None, samples)
    by_calls = {
        tuple(s["metadata"]["polarproxy"]["call_ids"]): (rw, a)
        for s, rw, a in zip(samples, raw, advantages, strict=True)
    }
    assert by_calls == {k: (r["reward"], r["advantage"]) for k, r in ref.items()}


VERL_PYTHON = Path(os.environ.get("POLARPROXY_VERL_PYTHON", REPO / ".cache" / "verl-venv" / "bin" / "python"))


def test_verls_own_policy_loss_on_the_replayed_rows_gives_polarproxy_trains_loss(
    recorded, tiny_model_dir, tmp_path
):
    """verl 0.9.1 in its own venv (`make verl-venv`; it needs Python < 3.13): the `verl` rows of two episodes
    of different lengths go through verl's `AgentLoopOutput` and the batch verl pads them into, and verl's
    `compute_policy_loss_vanilla` (token-mean) on the tiny model gives `polarproxy train`'s first-step
    loss on the same episodes' jsonl rows."""
    if not VERL_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"verl's venv is missing ({VERL_PYTHON}): `make test` builds it (make verl-venv)")
        pytest.skip(f"verl's venv is missing ({VERL_PYTHON}): make verl-venv")
    ours = _uneven_first_step(recorded, "verl", tmp_path / "v.parquet", tiny_model_dir, tmp_path)
    script = Path(__file__).resolve().parent / "verl_policy_loss.py"
    res = subprocess.run(
        [str(VERL_PYTHON), str(script), str(tmp_path / "v.parquet"), str(tiny_model_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    theirs = json.loads(res.stdout.strip().splitlines()[-1])
    assert theirs["rows"] == 2 and theirs["trainable_tokens"] == ours["trainable_tokens"]
    assert abs(ours["loss"]) > 0.01
    assert theirs["loss"] == pytest.approx(ours["loss"], abs=1e-5), (theirs, ours)
