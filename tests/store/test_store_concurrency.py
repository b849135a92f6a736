"""Sequence numbers stay dense and unique when threads and processes write one SQLite file at once."""

import multiprocessing
import threading

from polarproxy.store import CallStart, EpisodeStart, Store


def _start(episode_id: str, n: int) -> CallStart:
    return CallStart(
        episode_id=episode_id,
        dialect="openai_chat",
        method="POST",
        path="/v1/chat/completions",
        model="m",
        stream=False,
        request_headers={},
        request_body="{}",
        conversation=None,
        prompt_ids=[n],
    )


def test_seq_is_dense_and_unique_under_4_threads_x_50_calls(store):
    eid = store.create_episode(EpisodeStart(command=[]))
    barrier = threading.Barrier(4)
    results: list[tuple[str, int]] = []
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            barrier.wait()
            for i in range(50):
                results.append(store.begin_call(_start(eid, t * 1000 + i)))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(seq for _, seq in results) == list(range(200))
    calls = store.list_calls(eid)
    assert [c.seq for c in calls] == list(range(200))
    assert sorted(c.prompt_ids[0] for c in calls) == sorted(t * 1000 + i for t in range(4) for i in range(50))


def _process_worker(path: str, eid: str, n: int, tag: int, start, out) -> None:
    store = Store.open(path)
    start.wait()
    seqs = [store.begin_call(_start(eid, tag * 1000 + i))[1] for i in range(n)]
    store.close()
    out.put(seqs)


def test_seq_is_dense_and_unique_under_2_processes(db_path):
    with Store.open(db_path) as store:
        eid = store.create_episode(EpisodeStart(command=[]))
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_process_worker, args=(str(db_path), eid, 60, tag, start, out)) for tag in (1, 2)
    ]
    for p in procs:
        p.start()
    start.set()
    got = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sorted(got[0] + got[1]) == list(range(120))
    with Store.open(db_path) as store:
        assert [c.seq for c in store.list_calls(eid)] == list(range(120))


def test_readers_in_other_threads_see_committed_calls_while_a_writer_runs(store):
    eid = store.create_episode(EpisodeStart(command=[]))
    stop = threading.Event()
    seen: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            n = len(store.list_calls(eid))
            assert not seen or n >= seen[-1]  # monotonic: no torn reads
            seen.append(n)

    r = threading.Thread(target=reader)
    r.start()
    for i in range(100):
        store.begin_call(_start(eid, i))
    stop.set()
    r.join()
    assert seen and seen[-1] <= 100 and len(store.list_calls(eid)) == 100
