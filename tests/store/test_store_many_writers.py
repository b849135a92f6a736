"""Many writers: several `polarproxy serve` processes record many concurrent episodes into one database
(one PostgreSQL database, and one SQLite file). Every call lands in its episode with the right sequence
number, none is lost or duplicated, and every token array is exact.

Size: $POLARPROXY_TEST_MANY_WRITERS as PROCESSESxEPISODESxCALLS (default 4x32x20: 4 proxies, each
with 32 concurrent episodes of 20 calls, 2560 calls)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import psycopg
import pytest
from store_procs import drive, start_serve, start_stub

from polarproxy.conversation import Conversation, Message
from polarproxy.render.renderer import Renderer
from polarproxy.store import EpisodeStart, Store

pytestmark = pytest.mark.integration

SIZE = os.environ.get("POLARPROXY_TEST_MANY_WRITERS", "4x32x20")
PROCS, EPISODES, CALLS = (int(n) for n in SIZE.split("x"))
REPLY = "Hello there."


@pytest.fixture(scope="module")
def renderer(tiny_model_dir: Path) -> Renderer:
    return Renderer(tiny_model_dir)


@pytest.fixture(scope="module")
def stub(renderer: Renderer):
    s = start_stub([*renderer.encode(REPLY), renderer.stop_token_ids[0]], REPLY)
    yield s
    s.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "shared.db")
    return request.getfixturevalue("pg_server").create_database("many")


def _record(stub_url: str, model_dir: Path, db: str, procs: int, episodes: int, calls: int, tag: str):
    Store.open(db).close()  # migrated once up front (opening concurrently is tested in the migrations)
    proxies = [start_serve(stub_url, model_dir, db) for _ in range(procs)]
    try:
        t0 = time.perf_counter()
        runs = asyncio.run(drive([p.url for p in proxies], episodes, calls, tag))
        elapsed = time.perf_counter() - t0
    finally:
        for p in proxies:
            p.stop()
    print(f"\n{procs}x{episodes}x{calls} calls into {db.split(':')[0]}: {elapsed:.1f} s")
    errors = [e for r in runs for e in r.errors]
    if errors:
        logs = "".join(line for p in proxies for line in p.lines[-20:])
        pytest.fail(f"{len(errors)} calls failed, first: {errors[:3]}\nproxy logs:\n{logs}")
    return runs


def test_many_proxies_record_many_concurrent_episodes_exactly(stub, tiny_model_dir, renderer, db):
    runs = _record(stub.url, tiny_model_dir, db, PROCS, EPISODES, CALLS, "mw")
    assert [r.errors for r in runs if r.errors] == []
    reply_ids = [*renderer.encode(REPLY), renderer.stop_token_ids[0]]
    with Store.open(db) as store:
        recorded = {e.id: e for e in store.list_episodes(limit=None)}
        for run in runs:
            assert recorded[run.episode_id].calls == CALLS, run.episode_id
        assert sum(e.calls for e in recorded.values()) == PROCS * EPISODES * CALLS  # + nothing else
        for run in runs:
            calls = store.list_calls(run.episode_id)
            assert [c.seq for c in calls] == list(range(CALLS))
            assert {c.status for c in calls} == {"ok"}
            # each call carries this episode's own request, in order
            assert [c.conversation["messages"][-1]["content"] for c in calls] == run.users
            for c in calls:
                assert c.output_ids == reply_ids
                assert c.output_logprobs == [-0.5] * len(reply_ids)
                assert c.prompt_tokens == len(c.prompt_ids)  # the backend consumed exactly this prompt
            first = Conversation(
                messages=[
                    Message(role="system", content=f"You are agent {run.episode_id}."),
                    Message(role="user", content=run.users[0]),
                ]
            )
            assert calls[0].prompt_ids == renderer.render(first).ids
            for prev, call, user in zip(calls, calls[1:], run.users[1:], strict=False):
                # T2 across the turn: the earlier prompt and output, then only the new user turn
                n = len(prev.prompt_ids) + len(prev.output_ids)
                assert call.extended_from == prev.id and call.render_mode == "extended"
                assert call.prompt_ids[:n] == prev.prompt_ids + prev.output_ids
                added = renderer.tokenizer.decode(call.prompt_ids[n:])
                assert user in added and run.episode_id in added and "turn" not in added.replace(user, "")
                # stored linearly: a reference to the previous call and only the added tokens
                assert (call.prompt_base_call_id, call.prompt_base_len) == (prev.id, n)


def test_a_slow_transaction_on_one_episode_does_not_stall_other_episodes(stub, tiny_model_dir, pg_server):
    """PostgreSQL: another session holds one episode's row lock for seconds; a proxy recording other
    episodes answers its harnesses meanwhile (writers lock only their own episode's row)."""
    db = pg_server.create_database("slow")
    with Store.open(db) as store:
        store.create_episode(EpisodeStart(command=[]), episode_id="ep_locked")
    proxy = start_serve(stub.url, tiny_model_dir, db)
    try:
        with psycopg.connect(db) as blocker:
            blocker.execute("UPDATE episodes SET next_seq = next_seq WHERE id = 'ep_locked'")  # held open
            # every call of the other episodes completes while the lock is still held
            runs = asyncio.run(asyncio.wait_for(drive([proxy.url], 4, 3, "free"), 60))
            assert blocker.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            blocker.rollback()
    finally:
        proxy.stop()
    assert [r.errors for r in runs if r.errors] == []
    with Store.open(db) as store:
        assert sorted(
            (e.id, e.calls) for e in store.list_episodes(limit=None) if e.id.startswith("ep_free")
        ) == [(f"ep_free_0_{i}", 3) for i in range(4)]
