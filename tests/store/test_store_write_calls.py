"""Store.write_calls: a writer's group of begins and finishes in a fixed number of statements, all or none, each
call stored as begin_call / finish_call would store it; and the SQLite writers' turns (engine.py)."""

from __future__ import annotations

import fcntl
import os
import zlib

import pytest

from polarproxy.store import EpisodeStart, NotFoundError, Store, textdelta


def _episodes(store, n: int) -> list[str]:
    return [store.create_episode(EpisodeStart(command=["agent", str(i)])) for i in range(n)]


def _count_statements(store) -> list[str]:
    """The SQL text of every statement run from now on (through SQLAlchemy's cursor execution event)."""
    from sqlalchemy import event

    seen: list[str] = []

    def before(conn, cursor, statement, parameters, context, executemany):
        seen.append(statement)

    event.listen(store.engine, "before_cursor_execute", before)
    return seen


def test_a_group_of_begins_numbers_each_episode_in_order_in_three_statements(store, call_start, ok_result):
    eps = _episodes(store, 3)
    first = store.write_calls([(None, call_start(e, prompt_ids=list(range(20)))) for e in eps])
    store.finish_calls(
        [(cid, ok_result(output_ids=[7, 8], output_logprobs=[-1.0, -2.0])) for cid, _ in first]
    )
    seen = _count_statements(store)
    group = [eps[0], eps[1], eps[0], eps[2], eps[0]]
    prompts = [
        [*range(20), 7, 8, 100 + i] for i in range(len(group))
    ]  # each extends its episode's first call
    began = store.write_calls(
        [(None, call_start(e, prompt_ids=p)) for e, p in zip(group, prompts, strict=True)]
    )
    writes = [s for s in seen if not s.lstrip().upper().startswith(("BEGIN", "SELECT 1"))]
    assert len(writes) == 3  # sequence numbers, the bases, the rows: not three per call
    assert [seq for _, seq in began] == [1, 1, 2, 1, 3]
    for (cid, seq), e, p in zip(began, group, prompts, strict=True):
        call = store.get_call(cid)
        assert (call.episode_id, call.seq, call.prompt_ids, call.status) == (e, seq, p, "in_flight")
        assert call.prompt_base_call_id == first[eps.index(e)][0]  # stored as its base's tokens + 1 new
        assert call.prompt_base_len == 22


def test_a_group_with_an_unknown_episode_writes_nothing(store, call_start):
    (ep,) = _episodes(store, 1)
    with pytest.raises(NotFoundError, match="ep_missing"):
        store.write_calls([(None, call_start(ep)), (None, call_start("ep_missing"))])
    assert store.list_calls(ep) == []
    assert store.begin_call(call_start(ep))[1] == 0  # no sequence number was used up


def test_begins_and_finishes_of_one_group_are_stored_as_one_by_one_writes(store, call_start, ok_result):
    ep, other = _episodes(store, 2)
    ((earlier, _),) = store.write_calls([(None, call_start(ep, prompt_ids=list(range(12))))])
    result = ok_result(output_ids=[5, 6, 7], output_logprobs=[-0.5, -0.25, -0.125], latency_ms=12.5)
    began = store.write_calls([(None, call_start(other, prompt_ids=[1, 2, 3]))], [(earlier, result)])
    done = store.get_call(earlier)
    assert (done.status, done.output_ids, done.output_logprobs, done.latency_ms) == (
        "ok",
        [5, 6, 7],
        [-0.5, -0.25, -0.125],
        12.5,
    )
    assert store.get_call(began[0][0]).status == "in_flight"


def test_sqlite_writers_take_turns_through_the_side_file_lock(tmp_path):
    store = Store.open(tmp_path / "w.db")
    lock = tmp_path / "w.db-writelock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    try:
        # inside a write transaction the turn is held: nobody else gets it
        with store._write(), pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released at commit
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
        store.close()


@pytest.mark.parametrize("size", [0, 1, 600, 1024, 1025, 5000, 40_000])
def test_body_edits_compressed_with_a_small_window_read_back_with_zlib_defaults(size):
    raw = bytes((i * 7919) % 251 for i in range(size))
    packed = textdelta._compress(raw)
    assert zlib.decompress(packed) == raw
    assert len(packed) <= len(zlib.compress(raw, 6)) + 2


def test_the_written_columns_are_the_calls_tables_and_rows_are_built_by_name():
    """The positional statements take their values from one name list each (store/call_writes.py): every
    name is a column of `calls`, and a row with a name missing or one too many is refused, not shifted."""
    from polarproxy.store import schema
    from polarproxy.store.call_writes import BEGIN_COLUMNS, FINISH_COLUMNS, in_order

    table = {c.name for c in schema.calls.columns}
    for columns in (BEGIN_COLUMNS, FINISH_COLUMNS):
        assert len(set(columns)) == len(columns) and set(columns) <= table
    values = {c: i for i, c in enumerate(BEGIN_COLUMNS)}
    assert in_order(values, BEGIN_COLUMNS) == list(range(len(BEGIN_COLUMNS)))
    with pytest.raises(KeyError):
        in_order({**values, "typo": 1}, BEGIN_COLUMNS)
    del values["seq"]
    with pytest.raises(KeyError):
        in_order({**values, "sequence": 2}, BEGIN_COLUMNS)
