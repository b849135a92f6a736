"""Store.finish_calls: a run of finishes in one statement (the writer's group commit), all or none."""

from __future__ import annotations

import pytest

from polarproxy.store import EpisodeStart, Store, StoreError
from polarproxy.store.errors import NotFoundError


def _begin(store, episode, call_start, n: int) -> list[str]:
    return [store.begin_call(call_start(episode, prompt_ids=list(range(i, i + 12))))[0] for i in range(n)]


def test_finishing_many_calls_at_once_stores_each_as_finish_call_would(store, episode, call_start, ok_result):
    ids = _begin(store, episode, call_start, 6)
    results = [ok_result(output_ids=[100 + i, 7], output_logprobs=[-0.5, -i / 8]) for i in range(6)]
    store.finish_calls(list(zip(ids[:5], results[:5], strict=True)))
    store.finish_call(ids[5], results[5])
    calls = store.list_calls(episode)
    assert [c.output_ids for c in calls] == [[100 + i, 7] for i in range(6)]
    assert [c.output_logprobs for c in calls] == [[-0.5, -i / 8] for i in range(6)]
    assert {c.status for c in calls} == {"ok"}
    # later prompts may use the finished outputs as their base, as after finish_call
    prompt = [*calls[4].prompt_ids, *calls[4].output_ids, 1, 2, 3]
    cid, _ = store.begin_call(call_start(episode, prompt_ids=prompt))
    assert store.get_call(cid).prompt_base_call_id == ids[4]


def test_one_call_that_cannot_be_finished_fails_them_all(store, episode, call_start, ok_result):
    ids = _begin(store, episode, call_start, 3)
    batch = [(ids[0], ok_result()), ("call_does_not_exist", ok_result()), (ids[2], ok_result())]
    with pytest.raises(NotFoundError, match="call_does_not_exist"):
        store.finish_calls(batch)
    assert [c.status for c in store.list_calls(episode)] == ["in_flight"] * 3


def test_a_used_output_cannot_change_through_finish_calls_either(store, episode, call_start, ok_result):
    (base,) = _begin(store, episode, call_start, 1)
    store.finish_call(base, ok_result(output_ids=[5, 6], output_logprobs=[-1.0, -2.0]))
    full = [*store.get_call(base).prompt_ids, 5, 6]
    later, _ = store.begin_call(call_start(episode, prompt_ids=[*full, 9, 9]))
    assert store.get_call(later).prompt_base_call_id == base
    with pytest.raises(StoreError, match="cannot change"):
        store.finish_calls([(later, ok_result()), (base, ok_result(output_ids=[8], output_logprobs=[-1.0]))])
    assert store.get_call(later).status == "in_flight"
    store.finish_calls(
        [(later, ok_result()), (base, ok_result(output_ids=[5, 6], output_logprobs=[-1.0, -2.0]))]
    )  # a replay: fine
    assert store.get_call(later).status == "ok"


# ---- held connections (issue 12): one writer's call writes on the driver (SQLite files) -----------------------


def test_a_held_connection_writes_calls_in_one_transaction_and_raises_sqlalchemys_errors(
    db_path, call_start, ok_result
):
    import sqlalchemy.exc

    with Store.open(db_path) as store:
        ep = store.create_episode(EpisodeStart(command=["x"]))
        held = store.held_connection()
        assert held is not None
        with store.batch(held):
            [(cid, seq)] = store.write_calls([(None, call_start(ep))])
        assert seq == 0 and store.get_call(cid).status == "in_flight"
        with pytest.raises(NotFoundError, match="call_missing"), store.batch(held):
            store.finish_call(cid, ok_result(output_ids=[1], output_logprobs=[-0.5]))
            store.finish_call("call_missing", ok_result())
        assert store.get_call(cid).status == "in_flight"  # the whole transaction rolled back
        with pytest.raises(sqlalchemy.exc.OperationalError) as e, held.transaction() as conn:
            conn.exec_driver_sql("SELECT * FROM no_such_table")
        assert "no_such_table" in str(e.value.orig)
        with store.batch(held):  # connected again after the failure
            store.finish_call(cid, ok_result(output_ids=[1], output_logprobs=[-0.5]))
        assert store.get_call(cid).output_ids == [1]
        held.close()


def test_a_connection_held_without_waiting_neither_waits_nor_checkpoints(db_path, call_start, ok_result):
    """The event loop's connection (store/writer.py): a taken lock fails it at once, and the WAL's
    checkpoints (an fsync) are left to the writer thread's connection."""
    import sqlite3
    import time
    from concurrent.futures import ThreadPoolExecutor

    from polarproxy.store.engine import WriteBusy

    with Store.open(db_path) as store:
        ep = store.create_episode(EpisodeStart(command=["x"]))
        [(cid, _)] = store.write_calls([(None, call_start(ep))])
        held = store.held_connection(wait=False)
        assert held is not None and Store.open(":memory:").held_connection() is None
        with held.transaction() as conn:
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").all() == [(0,)]
        other = sqlite3.connect(db_path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        t0 = time.monotonic()
        with pytest.raises(StoreError, match="locked"), store.batch(held):
            store.finish_call(cid, ok_result())
        assert time.monotonic() - t0 < 1.0  # not the 10 s busy timeout
        other.execute("ROLLBACK")
        other.close()
        # holding the writers' flock: another writer's try (another thread: the flock is per thread) fails
        with held.transaction(), ThreadPoolExecutor(1) as pool:
            assert isinstance(pool.submit(_try_a_write, store).result(timeout=5), WriteBusy)
        assert store.get_call(cid).status == "in_flight"
        held.close()


def _try_a_write(store: Store) -> BaseException | None:
    held = store.held_connection(wait=False)
    assert held is not None
    try:
        with held.transaction():
            return None
    except Exception as e:
        return e
    finally:
        held.close()
