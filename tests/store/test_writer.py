"""The writer thread groups writes into commits; each awaited write is committed; a bad one fails alone."""

from __future__ import annotations

import asyncio

import pytest

from polarproxy.store import spool
from polarproxy.store.errors import StoreError
from polarproxy.store.records import CallResult, CallStart, EpisodeStart
from polarproxy.store.store import Store
from polarproxy.store.writer import StoreWriter


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


async def test_a_groups_call_writes_are_prepared_before_the_write_lock_is_taken(tmp_path, monkeypatch):
    """Packing, JSON and body edits happen outside the transaction (issue 12): while the writer thread
    prepares a group, another connection can take SQLite's write lock at once, so other writers of the
    file are not held up by this one's Python work."""
    import sqlite3

    store = Store.open(tmp_path / "w.db")
    writer = StoreWriter(store)
    ep = await writer.create_episode(EpisodeStart(command=["x"]))
    lock_free: list[bool] = []
    prepare = Store.prepare_calls

    def checking(self, begins, finishes=()):
        other = sqlite3.connect(tmp_path / "w.db", timeout=0, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            other.execute("ROLLBACK")
            lock_free.append(True)
        except sqlite3.OperationalError:  # "database is locked": the group's transaction is open
            lock_free.append(False)
        finally:
            other.close()
        return prepare(self, begins, finishes)

    monkeypatch.setattr(Store, "prepare_calls", checking)
    began = await asyncio.gather(*(writer.begin_call(start(ep, i)) for i in range(50)))
    await asyncio.gather(
        *(writer.finish_call(cid, CallResult(status="ok", output_ids=[7])) for cid, _ in began)
    )
    writer.close()
    assert lock_free and all(lock_free), lock_free
    assert [c.status for c in Store.open(tmp_path / "w.db").list_calls(ep)] == ["ok"] * 50


def test_store_batch_rolls_back_as_a_whole(tmp_path):
    store = Store.open(tmp_path / "b.db")
    ep = store.create_episode(EpisodeStart(command=["x"]))
    with pytest.raises(StoreError), store.batch():
        store.begin_call(start(ep, 1))
        store.finish_call("call_missing", CallResult(status="ok"))
    assert store.list_calls(ep) == []


# ---- outages: the spool (issue 5 part 5) ---------------------------------------------------------------------


@pytest.fixture
def spool_root(tmp_path, monkeypatch):
    root = tmp_path / "spool"
    monkeypatch.setenv("POLARPROXY_SPOOL_DIR", str(root))
    return root


def _unreachable(store: Store, folder, away) -> None:
    """Take the database's folder away: new connections fail with SQLite's 'unable to open database file'."""
    folder.rename(away)
    store.engine.dispose()


async def _wait(pred, timeout=20.0):
    for _ in range(int(timeout / 0.05)):
        if pred():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


async def test_happy_path_writes_no_spool_file(tmp_path, spool_root):
    store = Store.open(tmp_path / "w.db")
    writer = StoreWriter(store)
    ep = await writer.create_episode(EpisodeStart(command=["x"]))
    cid, seq = await writer.begin_call(start(ep, 1))
    await writer.finish_call(cid, CallResult(status="ok", output_ids=[7], output_logprobs=[-0.5]))
    writer.close()
    assert seq == 0 and not spool_root.exists()


async def test_unreachable_database_spools_in_order_and_replays_when_it_returns(tmp_path, spool_root):
    folder, away = tmp_path / "db", tmp_path / "db-away"
    store = Store.open(folder / "w.db")
    writer = StoreWriter(store)
    ep = await writer.create_episode(EpisodeStart(command=["x"]))
    first, seq0 = await writer.begin_call(start(ep, 0))
    await writer.finish_call(first, CallResult(status="ok", output_ids=[1], output_logprobs=[-0.1]))
    _unreachable(store, folder, away)
    began = [await writer.begin_call(start(ep, i)) for i in (1, 2, 3)]
    assert [seq for _, seq in began] == [-1, -1, -1]  # the database hands out seq on replay
    for i, (cid, _) in enumerate(began):
        await writer.finish_call(cid, CallResult(status="ok", output_ids=[10 + i], output_logprobs=[-0.5]))
    assert writer.spooling
    [spool_file] = spool_root.glob("*/*.spool")
    ops = [op["op"] for _, op in spool.read_records(spool_file)]
    assert ops == ["begin_call"] * 3 + ["finish_call"] * 3
    assert spool.pending(store.url)[0].calls == 3

    away.rename(folder)
    await _wait(lambda: not writer.spooling)
    assert not spool_file.exists()
    writer.close()
    with Store.open(folder / "w.db") as reopened:
        calls = reopened.list_calls(ep)
    assert [(c.id, c.seq, c.status) for c in calls] == [
        (first, seq0, "ok"),
        *((cid, i + 1, "ok") for i, (cid, _) in enumerate(began)),
    ]
    assert [c.output_ids for c in calls] == [[1], [10], [11], [12]]
    assert [c.prompt_ids for c in calls] == [[i, i + 1] for i in range(4)]


async def test_a_spool_that_cannot_be_written_fails_the_write_naming_both_causes(tmp_path, spool_root):
    folder, away = tmp_path / "db", tmp_path / "db-away"
    store = Store.open(folder / "w.db")
    writer = StoreWriter(store)
    ep = await writer.create_episode(EpisodeStart(command=["x"]))
    spool_root.parent.mkdir(exist_ok=True)
    spool_root.write_text("a file where the spool folder should be")
    _unreachable(store, folder, away)
    with pytest.raises(StoreError) as e:
        await writer.begin_call(start(ep, 1))
    assert "unable to open database file" in str(e.value)
    assert "cannot be written either" in str(e.value) and str(spool_root) in str(e.value)
    away.rename(folder)
    spool_root.unlink()
    await _wait(lambda: not writer.spooling)  # the database answers again: direct writes
    cid, seq = await writer.begin_call(start(ep, 2))
    writer.close()
    assert seq == 0
    with Store.open(folder / "w.db") as reopened:
        assert [c.id for c in reopened.list_calls(ep)] == [cid]


def test_replaying_a_spool_twice_stores_each_call_once(tmp_path, spool_root):
    from polarproxy.store.ids import new_call_id

    store = Store.open(tmp_path / "r.db")
    ep = store.create_episode(EpisodeStart(command=["x"]))
    path = tmp_path / "one.spool"
    f = spool.SpoolFile(path)
    cids = [new_call_id() for _ in range(3)]
    f.append([spool.op_begin_call(c, start(ep, i)) for i, c in enumerate(cids)])
    f.append([spool.op_finish_call(c, CallResult(status="ok", output_ids=[5])) for c in cids])
    f.close()
    with open(path, "ab") as torn:
        torn.write(spool.encode(spool.op_finish_episode(ep, "ok", 0))[:-7])  # a crash mid-append
    for _ in range(2):
        _, res = spool.replay(store, path)
        assert res.done and res.rejected == 0 and res.ops == 6
    assert [(c.id, c.seq, c.status) for c in store.list_calls(ep)] == [
        (c, i, "ok") for i, c in enumerate(cids)
    ]
    assert store.get_episode(ep).status == "running"  # the torn record was never acknowledged: not applied


def test_a_spooled_end_keeps_its_stage_times_and_its_graded_reward(tmp_path, spool_root):
    """What a rollout episode's end carries besides its status (stage times; the reward's diff and per-test
    results) survives an outage: written to the spool, replayed as it was (T6)."""
    from polarproxy.store.records import RewardOrigin

    store = Store.open(tmp_path / "g.db")
    ep = store.create_episode(EpisodeStart(command=["x"]))
    grading = {"resolved": True, "parser": "pytest -rA", "tests": {"t::a": "PASSED"}}
    origin = RewardOrigin(source="command", note="exit code 0", patch="diff --git a/f b/f\n", grading=grading)
    path = tmp_path / "end.spool"
    f = spool.SpoolFile(path)
    f.append([spool.op_set_rewards(ep, 1.0, True, {}, origin)])
    f.append([spool.op_finish_episode(ep, "ok", 0, {"prewarm": 0.5, "execute": 3.0, "evaluate": 1.0})])
    f.close()
    _, res = spool.replay(store, path)
    assert res.done and res.ops == 2
    (reward,) = store.list_rewards(ep)
    assert (reward.reward, reward.origin.patch, reward.origin.grading) == (
        1.0,
        "diff --git a/f b/f\n",
        grading,
    )
    got = store.get_episode(ep)
    assert (got.status, got.stages) == ("ok", {"prewarm": 0.5, "execute": 3.0, "evaluate": 1.0})


def test_a_spooled_begin_keeps_the_parsed_conversation_as_the_store_keeps_it(tmp_path, spool_root):
    """The gateway's CallStart carries its parsed Conversation (made plain data by the writer): a spooled
    begin is written as `conversation_dict()`, and its replay stores the same conversation (T3)."""
    from dataclasses import replace

    from polarproxy.conversation import Conversation, Message, Sampling, Tool, ToolCall
    from polarproxy.store.ids import new_call_id

    conv = Conversation(
        messages=[
            Message(role="user", content="hi"),
            Message(role="assistant", tool_calls=[ToolCall("call_1", "ls", '{"p": 1}')], signature="s"),
            Message(role="tool", content="a.txt", tool_call_id="call_1"),
        ],
        tools=[Tool(name="ls", parameters={"type": "object"})],
        sampling=Sampling(temperature=0.7, stop=["x"]),
        model="m",
    )
    store = Store.open(tmp_path / "c.db")
    ep = store.create_episode(EpisodeStart(command=["x"]))
    cid = new_call_id()
    line = spool.encode(spool.op_begin_call(cid, replace(start(ep, 0), conversation=conv)))
    assert spool.decode(line)["start"]["conversation"] == conv.to_dict()
    path = tmp_path / "conv.spool"
    f = spool.SpoolFile(path)
    f.append([spool.op_begin_call(cid, replace(start(ep, 0), conversation=conv))])
    f.close()
    _, res = spool.replay(store, path)
    assert res.done and res.rejected == 0
    assert store.get_call(cid).conversation == conv.to_dict()


# ---- owners (issue 5 part 4) ---------------------------------------------------------------------------------


def _writer_rows(store: Store) -> list[dict]:
    from polarproxy.store import schema

    with store._read() as conn:
        return [dict(r._mapping) for r in conn.execute(schema.writers.select())]


async def test_a_writer_registers_claims_its_episodes_and_refreshes_its_heartbeat(tmp_path, spool_root):
    store = Store.open(tmp_path / "o.db")
    writer = StoreWriter(store, heartbeat_s=0.05)
    ep = await writer.create_episode(EpisodeStart(command=["x"]))
    [row] = _writer_rows(store)
    assert row["id"] == writer.identity.id and row["pid"] == writer.identity.pid
    with store._read() as conn:
        from polarproxy.store import schema

        owner = conn.execute(schema.episodes.select().where(schema.episodes.c.id == ep)).one()._mapping
    assert owner["writer_id"] == writer.identity.id
    first = row["heartbeat_at"]
    await _wait(lambda: _writer_rows(store)[0]["heartbeat_at"] > first, 10)
    writer.close()


async def test_closing_ends_the_episodes_a_harness_named_and_a_later_call_reopens_one(tmp_path, spool_root):
    store = Store.open(tmp_path / "o.db")
    writer = StoreWriter(store)
    await writer.ensure_episode("ep_named0000001", EpisodeStart(command=["serve"]))
    await writer.begin_call(start("ep_named0000001", 1))
    writer.close()
    assert store.get_episode("ep_named0000001").status == "ok"
    again = StoreWriter(store)
    await again.ensure_episode("ep_named0000001", EpisodeStart(command=["serve"]))
    _, seq = await again.begin_call(start("ep_named0000001", 2))
    assert seq == 1 and store.get_episode("ep_named0000001").status == "running"
    again.close()
    assert [c.seq for c in store.list_calls("ep_named0000001")] == [0, 1]


async def test_a_run_of_finishes_with_a_bad_one_in_it_fails_only_that_one(tmp_path):
    store = Store.open(tmp_path / "w.db")
    writer = StoreWriter(store)
    ep = await writer.create_episode(EpisodeStart(command=["x"]))
    began = await asyncio.gather(*(writer.begin_call(start(ep, i)) for i in range(30)))
    ok = CallResult(status="ok", output_ids=[7], output_logprobs=[-0.5])
    finishes = [writer.finish_call(cid, ok) for cid, _ in began]
    finishes.insert(15, writer.finish_call("call_does_not_exist", ok))  # queued together: one group
    results = await asyncio.gather(*finishes, return_exceptions=True)
    assert isinstance(results[15], LookupError)
    assert results[:15] + results[16:] == [None] * 30
    writer.close()
    assert [c.status for c in Store.open(tmp_path / "w.db").list_calls(ep)] == ["ok"] * 30


# ---- finishes committed on the event loop's thread (issue 12) -------------------------------------------------


def _status_on_disk(path, call_id: str) -> str:
    """The call's status as another connection reads it now (a committed row, T6)."""
    import sqlite3

    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT status FROM calls WHERE id = ?", (call_id,)).fetchone()[0]
    finally:
        db.close()


async def test_an_idle_writers_finish_is_committed_on_the_loop_and_on_disk_when_awaited(tmp_path):
    writer = StoreWriter(Store.open(tmp_path / "w.db"))
    ep = await writer.create_episode(EpisodeStart(command=["x"]))
    cid, _ = await writer.begin_call(start(ep, 1))
    await asyncio.sleep(0.05)  # the thread has settled the begin and waits for more
    await writer.finish_call(cid, CallResult(status="ok", output_ids=[7], output_logprobs=[-0.5]))
    assert writer.inline_finishes == 1
    assert _status_on_disk(tmp_path / "w.db", cid) == "ok"
    writer.close()
    [call] = Store.open(tmp_path / "w.db").list_calls(ep)
    assert (call.output_ids, call.output_logprobs) == ([7], [-0.5])


@pytest.mark.parametrize("holder", ["another connection's write lock", "another polarproxy writer's turn"])
async def test_a_finish_that_would_wait_for_a_lock_waits_on_the_thread_and_the_loop_runs_on(tmp_path, holder):
    """The loop never waits out a busy timeout: a finish that finds SQLite's write lock or the writers'
    flock taken goes to the thread, which waits, and commits once the lock is free."""
    import fcntl
    import os
    import sqlite3

    path = tmp_path / "w.db"
    writer = StoreWriter(Store.open(path))
    ep = await writer.create_episode(EpisodeStart(command=["x"]))
    cid, _ = await writer.begin_call(start(ep, 1))
    await asyncio.sleep(0.05)
    if holder.startswith("another connection"):
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        release = lambda: other.execute("ROLLBACK")  # noqa: E731
    else:
        fd = os.open(f"{path}-writelock", os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        release = lambda: fcntl.flock(fd, fcntl.LOCK_UN)  # noqa: E731
    finishing = asyncio.ensure_future(writer.finish_call(cid, CallResult(status="ok", output_ids=[7])))
    ticks = 0
    for _ in range(20):  # 0.2 s of a loop that must keep running meanwhile
        await asyncio.sleep(0.01)
        ticks += 1
    assert not finishing.done() and ticks == 20
    assert _status_on_disk(path, cid) == "in_flight"
    release()
    await asyncio.wait_for(finishing, 15)
    assert writer.inline_finishes == 0
    assert _status_on_disk(path, cid) == "ok"
    writer.close()


async def test_a_finish_while_the_thread_is_writing_is_queued_behind_it(tmp_path, monkeypatch):
    import threading

    writer = StoreWriter(Store.open(tmp_path / "w.db"))
    ep = await writer.create_episode(EpisodeStart(command=["x"]))
    cid, _ = await writer.begin_call(start(ep, 1))
    entered, go_on = threading.Event(), threading.Event()
    prepare = Store.prepare_calls

    def held_up(self, begins, finishes=()):
        if begins:  # the thread's next group: held up while the finish below comes in
            entered.set()
            go_on.wait(10)
        return prepare(self, begins, finishes)

    monkeypatch.setattr(Store, "prepare_calls", held_up)
    second = asyncio.ensure_future(writer.begin_call(start(ep, 2)))
    assert await asyncio.to_thread(entered.wait, 10)
    finishing = asyncio.ensure_future(writer.finish_call(cid, CallResult(status="ok", output_ids=[7])))
    await asyncio.sleep(0.05)
    assert not finishing.done()  # behind the thread's group, not around it
    go_on.set()
    await asyncio.gather(second, finishing)
    assert writer.inline_finishes == 0
    writer.close()
    assert [c.status for c in Store.open(tmp_path / "w.db").list_calls(ep)] == ["ok", "in_flight"]


async def test_a_finish_too_large_for_the_loop_is_written_by_the_thread(tmp_path):
    from polarproxy.store.writer import INLINE_MAX_BYTES

    writer = StoreWriter(Store.open(tmp_path / "w.db"))
    ep = await writer.create_episode(EpisodeStart(command=["x"]))
    cid, _ = await writer.begin_call(start(ep, 1))
    await asyncio.sleep(0.05)
    body = "x" * (INLINE_MAX_BYTES + 1)
    await writer.finish_call(cid, CallResult(status="ok", output_ids=[7], response_body=body))
    assert writer.inline_finishes == 0
    assert _status_on_disk(tmp_path / "w.db", cid) == "ok"
    writer.close()
