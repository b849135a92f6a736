import dataclasses
import re
import sqlite3
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from polarproxy.store import (
    AmbiguousIdError,
    CallResult,
    EpisodeStart,
    NotFoundError,
    Store,
    StoreError,
    default_db_url,
)
from polarproxy.store.ids import new_call_id, new_episode_id
from polarproxy.store.records import RewardOrigin


def test_open_creates_parent_folders_and_sets_sqlite_pragmas(tmp_path):
    path = tmp_path / "a" / "b" / "pp.db"
    with Store.open(path) as store, store.engine.connect() as conn:
        pragma = lambda name: conn.exec_driver_sql(f"PRAGMA {name}").scalar()  # noqa: E731
        assert pragma("journal_mode") == "wal"
        assert pragma("synchronous") == 1  # NORMAL
        assert pragma("busy_timeout") == 10000
        assert pragma("foreign_keys") == 1
    assert path.is_file()


def test_open_accepts_sqlite_urls_and_memory(tmp_path):
    with Store.open(f"sqlite:///{tmp_path / 'u.db'}") as store:
        store.create_episode(EpisodeStart(command=["x"]))
    assert (tmp_path / "u.db").is_file()
    with Store.open(":memory:") as store:
        eid = store.create_episode(EpisodeStart(command=["x"]))
        assert store.get_episode(eid).command == ["x"]


def test_default_db_url_follows_env_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("POLARPROXY_DB", "postgresql://u@h/db")
    assert default_db_url() == "postgresql://u@h/db"
    monkeypatch.delenv("POLARPROXY_DB")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_db_url() == str(tmp_path / "xdg" / "polarproxy" / "polarproxy.db")
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_db_url() == str(tmp_path / "home" / ".local" / "share" / "polarproxy" / "polarproxy.db")


def test_open_without_argument_uses_POLARPROXY_DB(monkeypatch, tmp_path):
    monkeypatch.setenv("POLARPROXY_DB", str(tmp_path / "env" / "x.db"))
    Store.open().close()
    assert (tmp_path / "env" / "x.db").is_file()


def test_unopenable_databases_raise_store_error_naming_the_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreError, match=r"Cannot create the folder .*file.*POLARPROXY_DB"):
        Store.open(blocker / "x.db")
    with pytest.raises(StoreError, match=r"is a folder"):
        Store.open(tmp_path)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match=r"garbage\.db.*not a database.*--db"):
        Store.open(garbage)
    with pytest.raises(StoreError, match=r"Cannot open the database"):
        Store.open("nosuchdialect://x/y")


def test_ids_are_well_formed_and_sort_by_creation():
    eps = [new_episode_id() for _ in range(500)]
    calls = [new_call_id() for _ in range(500)]
    assert all(re.fullmatch(r"ep_[0-9a-z]{12}", e) for e in eps)
    assert all(re.fullmatch(r"call_[0-9a-z]{16}", c) for c in calls)
    assert eps == sorted(eps) and len(set(eps)) == 500
    assert calls == sorted(calls) and len(set(calls)) == 500
    assert new_episode_id(now_ms=1_000)[:12] < new_episode_id(now_ms=2_000_000_000_000)[:12]


def test_episode_round_trip_finish_and_reward(store):
    start = EpisodeStart(
        command=["claude", "-p", "fix it"],
        harness="claude-code",
        cwd="/w",
        task="t1",
        group_id="g1",
        metadata={"seed": 3, "tags": ["a"]},
    )
    before = time.time()
    eid = store.create_episode(start)
    ep = store.get_episode(eid)
    assert (ep.command, ep.harness, ep.cwd, ep.task, ep.group_id, ep.metadata) == (
        ["claude", "-p", "fix it"],
        "claude-code",
        "/w",
        "t1",
        "g1",
        {"seed": 3, "tags": ["a"]},
    )
    assert ep.status == "running" and ep.ended_at is None and ep.reward is None
    assert before <= ep.started_at <= time.time()
    store.finish_episode(eid, status="ok", exit_code=0)
    store.set_reward(eid, 0.75)
    ep = store.get_episode(eid)
    assert (ep.status, ep.exit_code, ep.reward) == ("ok", 0, 0.75) and ep.ended_at >= ep.started_at
    with pytest.raises(ValueError, match=r"Unknown episode status 'done'. Must be one of 'running', 'ok'"):
        store.finish_episode(eid, status="done")
    with pytest.raises(NotFoundError):
        store.set_reward("ep_nope", 1.0)


def test_create_episode_with_given_id_and_duplicate(store):
    assert store.create_episode(EpisodeStart(command=[]), episode_id="ep_fixed") == "ep_fixed"
    with pytest.raises(StoreError, match="exists"):
        store.create_episode(EpisodeStart(command=[]), episode_id="ep_fixed")
    # "ensure": an exact ID is created once, even when another episode's ID starts with it
    assert (
        store.create_episode(EpisodeStart(command=["a"]), episode_id="ep_fixed", exist_ok=True) == "ep_fixed"
    )
    assert store.create_episode(EpisodeStart(command=["b"]), episode_id="ep_fix", exist_ok=True) == "ep_fix"
    assert store.get_episode("ep_fixed").command == [] and store.get_episode("ep_fix").command == ["b"]


def test_begin_and_finish_call_round_trip_every_field(store, episode, call_start, ok_result):
    start = call_start(
        episode,
        stream=False,
        prompt_ids=[1, 2, 3, 2**31 - 1],
        backend="http://127.0.0.1:30000",
        backend_kind="sglang",
        fidelity="tokens",
        render_mode="extended",
        extended_from="call_earlier",
        render_note="note",
        started_at=1234.5,
        request_body='{"x": "ünïcode"}',
        conversation={"messages": [{"role": "user", "content": "ü"}], "tools": [{"name": "f"}]},
        temperature=0.6,
        logprob_temperature=0.6,
        top_p=0.95,
        top_k=20,
        sampling_sent={"temperature": 0.6, "chosen_by": {"temperature": "flag"}},
    )
    cid, seq = store.begin_call(start)
    result = ok_result(
        error=None,
        completion={
            "text": "t",
            "reasoning": "r",
            "tool_calls": [{"id": "c1", "name": "f", "arguments": "{}"}],
        },
        output_ids=[7, 8, 151645],
        output_logprobs=[-0.5, -1.25, -0.0],
        latency_ms=12.5,
        ttft_ms=3.25,
        ended_at=1240.0,
        prompt_tokens=4,
        completion_tokens=3,
    )
    store.finish_call(cid, result)
    call = store.get_call(cid)
    assert (call.id, call.episode_id, call.seq, call.reward) == (cid, episode, seq, None)
    for f in dataclasses.fields(start):
        if f.name not in (
            "episode_id",
            "prompt_base_call_id",
            "prompt_base_len",
            "sampling_sent",
            "conversation",
        ):  # hints, not stored as given; what was sent is stored with the conversation
            assert getattr(call, f.name) == getattr(start, f.name), f.name
    assert call.conversation == {**start.conversation, "sent_sampling": start.sampling_sent}
    assert call.recorded_logprob_temperature == 0.6
    for f in dataclasses.fields(result):
        assert getattr(call, f.name) == getattr(result, f.name), f.name


def test_in_flight_call_reads_as_in_flight_with_its_prompt(store, episode, call_start):
    cid, _ = store.begin_call(call_start(episode))
    call = store.get_call(cid)
    assert call.status == "in_flight" and call.ended_at is None
    assert call.prompt_ids == call_start(episode).prompt_ids and call.output_ids == [] == call.output_logprobs


def _status_seen_by_another_connection(store, cid):
    other = create_engine(store.connect_url)  # an independent connection sees only committed rows
    try:
        with other.connect() as conn:
            return conn.execute(text("SELECT status FROM calls WHERE id = :id"), {"id": cid}).scalar()
    finally:
        other.dispose()


def test_call_is_on_disk_when_begin_call_returns(store, episode, call_start, ok_result):
    cid, _ = store.begin_call(call_start(episode))
    assert _status_seen_by_another_connection(store, cid) == "in_flight"
    store.finish_call(cid, ok_result())
    assert _status_seen_by_another_connection(store, cid) == "ok"


def test_seq_is_dense_per_episode_and_independent_across_episodes(store, episode, call_start):
    other = store.create_episode(EpisodeStart(command=[]))
    seqs = [store.begin_call(call_start(episode))[1] for _ in range(3)]
    assert seqs == [0, 1, 2]
    assert store.begin_call(call_start(other))[1] == 0
    assert store.begin_call(call_start(episode))[1] == 3


def test_begin_call_for_unknown_episode_raises(store, call_start):
    with pytest.raises(NotFoundError, match="No episode 'ep_missing'"):
        store.begin_call(call_start("ep_missing"))


def test_finish_call_rejects_bad_input_before_writing(store, episode, call_start, ok_result):
    cid, _ = store.begin_call(call_start(episode))
    with pytest.raises(ValueError, match="Unknown final call status 'in_flight'"):
        store.finish_call(cid, CallResult(status="in_flight"))
    with pytest.raises(ValueError, match="2 output IDs but 1 logprobs"):
        store.finish_call(cid, CallResult(status="ok", output_ids=[1, 2], output_logprobs=[-1.0]))
    with pytest.raises(ValueError, match="int32"):
        store.finish_call(cid, CallResult(status="ok", output_ids=[2**31]))
    assert store.get_call(cid).status == "in_flight"
    with pytest.raises(NotFoundError):
        store.finish_call("call_missing", ok_result())


SECRET = "sk-live-THIS-MUST-NEVER-BE-STORED-1234567890"


def _all_stored_text(store) -> str:
    """Every value of every row of every table, as text."""
    out = []
    with store.engine.connect() as conn:
        for table in inspect(store.engine).get_table_names():
            for row in conn.execute(text(f'SELECT * FROM "{table}"')):
                out.extend(
                    bytes(v).decode("latin-1") if isinstance(v, bytes | memoryview) else str(v) for v in row
                )
    return "\n".join(out)


def test_secret_headers_are_never_stored(store, episode, call_start):
    headers = {
        "Authorization": f"Bearer {SECRET}",
        "x-api-key": SECRET,
        "X-Goog-Api-Key": SECRET,
        "api-key": SECRET,
        "Cookie": f"session={SECRET}",
        "Proxy-Authorization": f"Basic {SECRET}",
        "content-type": "application/json",
    }
    path = f"/v1beta/models/m:streamGenerateContent?alt=sse&key={SECRET}"
    cid, _ = store.begin_call(call_start(episode, request_headers=headers, path=path))
    call = store.get_call(cid)
    assert call.request_headers == {
        k: ("application/json" if k == "content-type" else "<redacted>") for k in headers
    }
    assert call.path == "/v1beta/models/m:streamGenerateContent?alt=sse&key=%3Credacted%3E"
    stored = _all_stored_text(store)
    assert call.path in stored and SECRET not in stored
    if store.dialect == "sqlite":  # the bytes on disk too, before and after the WAL is checkpointed
        db_path = Path(store.connect_url.removeprefix("sqlite:///"))
        for when in ("open (WAL not yet checkpointed)", "closed"):
            files = [p for p in db_path.parent.iterdir() if p.name.startswith(db_path.name)]
            assert files, when
            assert all(SECRET.encode() not in p.read_bytes() for p in files), when
            store.close()


def test_get_episode_by_unique_prefix_with_or_without_ep(store):
    a = store.create_episode(EpisodeStart(command=[]), episode_id="ep_aaaa1111")
    store.create_episode(EpisodeStart(command=[]), episode_id="ep_aaaa2222")
    assert store.get_episode("ep_aaaa1").id == a
    assert store.get_episode("aaaa1").id == a
    assert store.get_episode(a).id == a
    with pytest.raises(
        AmbiguousIdError, match=r"'aaaa' is ambiguous: it matches ep_aaaa1111, ep_aaaa2222"
    ) as err:
        store.get_episode("aaaa")
    assert err.value.candidates == ["ep_aaaa1111", "ep_aaaa2222"]
    with pytest.raises(NotFoundError, match=r"No episode ID starts with 'zz'. Run `polarproxy ls`"):
        store.get_episode("zz")
    with pytest.raises(NotFoundError):  # '_' and '%' are literal characters, not LIKE wildcards
        store.get_episode("ep%")


def test_get_episode_at_n_is_the_nth_newest(store):
    ids = [store.create_episode(EpisodeStart(command=[str(i)])) for i in range(3)]
    named = store.create_episode(EpisodeStart(command=[]), episode_id="aaa-user-named")
    assert [store.get_episode(f"@{n}").id for n in (1, 2, 3, 4)] == [named, *ids[::-1]]
    assert store.get_episode(" @2 ").id == ids[2]
    with pytest.raises(
        NotFoundError, match=r"No episode @5: the store holds 4 episodes. Run `polarproxy ls`"
    ):
        store.get_episode("@5")
    with pytest.raises(NotFoundError, match=r"No episode @0: @1 is the latest episode"):
        store.get_episode("@0")
    with pytest.raises(NotFoundError, match=r"No episode ID starts with '@x'"):
        store.get_episode("@x")
    with pytest.raises(NotFoundError, match=r"No episode ID starts with '@9999999999'"):  # not an overflow
        store.get_episode("@9999999999")


def test_list_episodes_newest_first_with_call_and_token_counts(store, call_start, ok_result):
    ids = [store.create_episode(EpisodeStart(command=[str(i)])) for i in range(3)]
    cid, _ = store.begin_call(call_start(ids[1], prompt_ids=[1, 2, 3]))
    store.finish_call(cid, ok_result(output_ids=[4, 5], output_logprobs=[-1.0, -1.0]))
    store.begin_call(call_start(ids[1], prompt_ids=[1]))
    listed = store.list_episodes()
    assert [e.id for e in listed] == ids[::-1]
    assert [(e.calls, e.tokens) for e in listed] == [(0, 0), (2, 6), (0, 0)]
    assert [e.id for e in store.list_episodes(limit=1, offset=1)] == [ids[1]]
    assert len(store.list_episodes(limit=None)) == 3
    uncounted = store.list_episodes(counts=False)  # what exports read: no call row is visited
    assert [(e.id, e.calls, e.tokens) for e in uncounted] == [(eid, None, None) for eid in ids[::-1]]
    assert [e.command for e in uncounted] == [e.command for e in listed]


def test_call_statuses_counts_each_status_of_one_episode(store, call_start, ok_result):
    eid = store.create_episode(EpisodeStart(command=[]))
    other = store.create_episode(EpisodeStart(command=[]))
    assert store.call_statuses(eid) == {}
    cids = [store.begin_call(call_start(eid))[0] for _ in range(4)]
    store.begin_call(call_start(other))
    store.finish_call(cids[0], ok_result())
    store.finish_call(cids[1], ok_result())
    store.finish_call(cids[2], CallResult(status="failed", error="backend 500"))
    assert store.call_statuses(eid) == {"ok": 2, "failed": 1, "in_flight": 1}
    assert store.call_statuses(other) == {"in_flight": 1}
    assert store.call_statuses(eid) == {
        s: sum(c.status == s for c in store.list_calls(eid)) for s in ("ok", "failed", "in_flight")
    }


def test_iter_calls_orders_by_episode_start_then_seq_and_filters(store, call_start, ok_result):
    first = store.create_episode(EpisodeStart(command=[]))
    second = store.create_episode(EpisodeStart(command=[]))
    made = []
    for eid in (second, first, second, first):
        cid, _ = store.begin_call(call_start(eid))
        made.append((eid, cid))
    store.finish_call(made[0][1], ok_result())
    store.finish_call(made[1][1], CallResult(status="failed", error="backend 500"))
    got = [(c.episode_id, c.seq) for c in store.iter_calls()]
    assert got == [(first, 0), (first, 1), (second, 0), (second, 1)]
    assert [c.id for c in store.iter_calls(status="ok")] == [made[0][1]]
    assert [c.id for c in store.iter_calls([first], status="failed")] == [made[1][1]]
    assert [c.seq for c in store.list_calls(second)] == [0, 1]
    with pytest.raises(NotFoundError, match="ep_nope"):
        list(store.iter_calls(["ep_nope", first]))
    with pytest.raises(ValueError, match="Unknown call status 'done'"):
        list(store.iter_calls(status="done"))


def test_iter_calls_reads_many_calls_across_batches(store, episode, call_start):
    for i in range(150):
        _cid, _ = store.begin_call(call_start(episode, prompt_ids=[i]))
    assert [c.prompt_ids for c in store.iter_calls()] == [[i] for i in range(150)]


def test_mark_interrupted_calls_only_touches_ended_episodes(store, call_start, ok_result):
    running = store.create_episode(EpisodeStart(command=[]))
    ended = store.create_episode(EpisodeStart(command=[]))
    live, _ = store.begin_call(call_start(running))
    dead, _ = store.begin_call(call_start(ended))
    done, _ = store.begin_call(call_start(ended))
    store.finish_call(done, ok_result())
    store.finish_episode(ended, status="interrupted")
    assert store.mark_interrupted_calls() == 1
    assert store.get_call(dead).status == "interrupted" and "ended before" in store.get_call(dead).error
    assert store.get_call(live).status == "in_flight"
    assert store.get_call(done).status == "ok"
    assert store.mark_interrupted_calls() == 0


def test_already_redacted_values_are_stored_as_given(store, episode, call_start):
    path = "/v1/models/m:generateContent?key=%3Credacted%3E&x=1"
    headers = {"Authorization": "<redacted>", "Accept": "text/event-stream"}
    cid, _ = store.begin_call(call_start(episode, request_headers=headers, path=path))
    call = store.get_call(cid)
    assert (call.request_headers, call.path) == (headers, path)


def test_a_write_that_cannot_get_the_lock_raises_store_error(db_path, monkeypatch, call_start):
    from polarproxy.store import engine as engine_module

    monkeypatch.setattr(engine_module, "BUSY_TIMEOUT_S", 0.2)
    with Store.open(db_path) as store:
        eid = store.create_episode(EpisodeStart(command=[]))
        blocker = sqlite3.connect(db_path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreError, match=r"Cannot write to the database sqlite:///.*locked"):
                store.begin_call(call_start(eid))
            assert len(store.list_calls(eid)) == 0  # readers are not blocked by the writer (WAL)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert store.begin_call(call_start(eid))[1] == 0


def test_calls_episodes_and_rewards_whose_text_holds_nul_bytes_are_recorded_on_every_backend(
    store, call_start
):
    # A malformed request can carry a NUL byte (a body that is not JSON, a model name): PostgreSQL's text
    # columns cannot hold one, and such a call must still be recorded, not lost.
    ep = store.create_episode(EpisodeStart(command=["agent"], task="fix \x00 it", cwd="/w\x00"))
    body = '{"model": "m\x00", "messages": [\x00'
    cid, _ = store.begin_call(call_start(ep, request_body=body, model="m\x00", prompt_ids=list(range(20))))
    store.finish_call(cid, CallResult(status="failed", error="bad \x00 request", http_status=400))
    # the next call of the episode stores its body as an edit of that one's, as stored
    later, _ = store.begin_call(call_start(ep, request_body=body + "more", prompt_ids=list(range(24))))
    got, after = store.get_call(cid), store.get_call(later)
    kept = "\x00" if store.dialect == "sqlite" else "\ufffd"  # SQLite keeps text exactly
    assert (got.status, got.http_status) == ("failed", 400)
    assert got.request_body == body.replace("\x00", kept)
    assert (got.model, got.error) == (f"m{kept}", f"bad {kept} request")
    assert after.request_body == body.replace("\x00", kept) + "more"
    episode = store.get_episode(ep)
    assert (episode.task, episode.cwd) == (f"fix {kept} it", f"/w{kept}")
    store.set_reward(ep, 0.0, origin=RewardOrigin(source="command", output_tail="E\x00", note="n\x00"))
    (reward,) = store.list_rewards(ep)
    assert (reward.origin.output_tail, reward.origin.note) == (f"E{kept}", f"n{kept}")
