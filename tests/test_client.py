"""polarproxy.client against a real `serve` on loopback: episodes through the control API, and the trajectory
stream that hands each finished trajectory to a puller exactly once."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import httpx
import jsonschema
import orjson
import pytest
from serving import ServeThread, Stub

from polarproxy.client import AsyncClient, Client, ControlError
from polarproxy.export.run import run_export
from polarproxy.store import Store

TOKEN = "client-test-token"
SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "export-row.v3.json"


@pytest.fixture
def served(tiny_model_dir, tmp_path):
    stub = Stub(tiny_model_dir)
    s = ServeThread(stub.url, tiny_model_dir, tmp_path / "c.db", token=TOKEN)
    yield s
    s.stop()
    stub.stop()


def call(ep, text: str = "hi") -> None:
    r = httpx.post(
        f"{ep.base_urls['openai']}/chat/completions",
        json={"messages": [{"role": "user", "content": text}]},
        headers={"authorization": f"Bearer {ep.api_key}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text


def test_a_puller_gets_every_trajectory_exactly_once_while_episodes_finish(served, tmp_path):
    schema = orjson.loads(SCHEMA.read_bytes())
    n = 4
    pulled: list[dict] = []
    with Client(served.url, TOKEN) as pp:
        assert pp.health()["status"] == "ok"
        with pytest.raises(ControlError) as refused:
            Client(served.url, "wrong").create_episode()
        assert refused.value.status == 401

        def pull() -> None:
            with Client(served.url, TOKEN) as puller:
                for row in puller.trajectories(wait=0.5):
                    pulled.append(row)
                    if len(pulled) == n:
                        return

        puller = threading.Thread(target=pull)
        puller.start()
        made = []
        for i in range(n):  # episodes finish while the puller polls
            ep = pp.create_episode(task="t", harness="test", metadata={"i": i})
            assert ep.env()["OPENAI_API_KEY"] == ep.api_key and ep.api_key not in repr(ep)
            call(ep)
            pp.reward(ep.episode_id, 0.25 * i)
            pp.finish_episode(ep.episode_id, exit_code=0)
            made.append(ep.episode_id)
        puller.join(60)
        assert not puller.is_alive()
        assert sorted(r["episode_id"] for r in pulled) == sorted(made)  # each once
        for row in pulled:
            jsonschema.validate(row, schema)
        assert {r["episode_id"]: r["reward"] for r in pulled} == {e: 0.25 * i for i, e in enumerate(made)}
        rows, cursor = pp.pull(wait=0)  # from the start: all again; from the end: nothing
        assert len(rows) == n
        assert pp.pull(cursor=cursor, wait=0.3)[0] == []
        assert [e["id"] for e in pp.episodes(status="ok", task="t")] == made[::-1]
        assert pp.episodes(status="running", task="t") == []
        merged, _ = pp.pull(strategy="prefix-merge", wait=0)
    # the rows a trainer pulls are those `polarproxy export` writes for the same episodes
    for strategy, got in (("per-request", pulled), ("prefix-merge", merged)):
        out = tmp_path / f"{strategy}.jsonl"
        with Store.open(tmp_path / "c.db") as store:
            run_export(store, out, strategy=strategy)
        exported = [orjson.loads(line) for line in out.read_bytes().splitlines()]
        assert sorted(got, key=lambda r: r["episode_id"]) == sorted(exported, key=lambda r: r["episode_id"])


async def test_groups_complete_waits_for_the_whole_group_and_carries_its_advantages(served):
    async with AsyncClient(served.url, TOKEN) as pp:
        a = await pp.create_episode(task="t", group="g")
        b = await pp.create_episode(task="t", group="g")
        solo = await pp.create_episode(task="t")  # no group: a group of its own
        for ep in (a, b, solo):
            await asyncio.to_thread(call, ep)
        await pp.finish_episode(a.episode_id, exit_code=0, reward=1.0)
        await pp.finish_episode(solo.episode_id, exit_code=0, reward=1.0)
        rows, cursor = await pp.pull(groups="complete", advantages="grpo", wait=0.3)
        assert rows == []  # g is not complete; the lone episode's group has one reward: no advantage
        rows, cursor = await pp.pull(groups="complete", cursor=cursor, wait=0.3)
        assert rows == []  # what the cursor passed does not come again
        await pp.finish_episode(b.episode_id, exit_code=1, reward=0.0)
        got = []
        async for row in pp.trajectories(
            groups="complete", advantages="grpo", cursor=cursor, wait=0.5, stop_when_idle=True
        ):
            got.append(row)
        adv = {r["episode_id"]: r["advantage"] for r in got}
        assert adv.keys() == {a.episode_id, b.episode_id}
        assert adv[a.episode_id] > 0 > adv[b.episode_id]
        assert adv[a.episode_id] == pytest.approx(-adv[b.episode_id])
        assert adv[a.episode_id] == pytest.approx(0.5 / (0.5**0.5 + 1e-6))  # the sample std of [1, 0]
        population, _ = await pp.pull(
            groups="complete", advantages="grpo", std_estimator="population", wait=0
        )
        by_pop = {r["episode_id"]: r["advantage"] for r in population}
        assert by_pop[a.episode_id] == pytest.approx(0.999998)  # (r - mean) / (population std + 1e-6)
        assert {r["group_id"] for r in got} == {"g"}
        whole = await pp.pull(groups="complete", strategy="prefix-merge", wait=0)
        assert sorted(r["episode_id"] for r in whole[0]) == sorted(
            [a.episode_id, b.episode_id, solo.episode_id]
        )
