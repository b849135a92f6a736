"""The writer thread groups writes into commits; each awaited write is committed; a bad one fails alone."""

from __future__ import annotations

import asyncio

import pytest

from polarproxy.capture.store_writer import StoreWriter
from polarproxy.store.errors import StoreError
from polarproxy.store.records import CallResult, CallStart, EpisodeStart
from polarproxy.store.store import Store


def start(episode: str, i: int) -> CallStart:
    return CallStart(
        episode_id=episode,
        dialect="openai_chat",
        method="POST",
        path="/v1/chat/completions",
        model="m",
        stream=False,
        request_headers={},
        request_body=f"{i}",
        conversation=None,
        prompt_ids=[i, i + 1],
    )


async def test_concurrent_writes_are_grouped_and_all_committed(tmp_path):
    store = Store.open(tmp_path / "w.db")
    writer = StoreWriter(store)
    ep = await writer.create_episode(EpisodeStart(command=["x"]))
    began = await asyncio.gather(*(writer.begin_call(start(ep, i)) for i in range(200)))
    assert sorted(seq for _, seq in began) == list(range(200))
    await asyncio.gather(
        *(
            writer.finish_call(cid, CallResult(status="ok", output_ids=[7], output_logprobs=[-0.5]))
            for cid, _ in began
        )
    )
    writer.close()
    reopened = Store.open(tmp_path / "w.db")  # another connection sees every row: they were committed
    calls = reopened.list_calls(ep)
    assert [c.status for c in calls] == ["ok"] * 200
    assert [c.prompt_ids for c in calls] == [[i, i + 1] for i in range(200)]


async def test_a_failing_write_in_a_group_fails_alone(tmp_path):
    store = Store.open(tmp_path / "w.db")
    writer = StoreWriter(store)
    ep = await writer.create_episode(EpisodeStart(command=["x"]))
    good = [writer.begin_call(start(ep, i)) for i in range(20)]
    bad = writer.finish_call("call_does_not_exist", CallResult(status="ok"))
    results = await asyncio.gather(*good, bad, return_exceptions=True)
    assert isinstance(results[-1], StoreError | LookupError)
    assert all(isinstance(r, tuple) for r in results[:-1])
    writer.close()
    assert len(Store.open(tmp_path / "w.db").list_calls(ep)) == 20


async def test_close_applies_what_is_queued(tmp_path):
    store = Store.open(tmp_path / "w.db")
    writer = StoreWriter(store)
    ep = await writer.create_episode(EpisodeStart(command=["x"]))
    pending = asyncio.ensure_future(writer.begin_call(start(ep, 1)))
    await asyncio.sleep(0)
    writer.close()
    await pending
    assert len(Store.open(tmp_path / "w.db").list_calls(ep)) == 1


def test_store_batch_rolls_back_as_a_whole(tmp_path):
    store = Store.open(tmp_path / "b.db")
    ep = store.create_episode(EpisodeStart(command=["x"]))
    with pytest.raises(StoreError), store.batch():
        store.begin_call(start(ep, 1))
        store.finish_call("call_missing", CallResult(status="ok"))
    assert store.list_calls(ep) == []
