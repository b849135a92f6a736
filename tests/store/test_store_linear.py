"""Linear-size token storage: a call that extends an earlier call of its episode stores only the tokens it
adds, as a verified reference; every prompt reads back exactly (T1), on both backends."""

import random

import orjson
import pytest
from sqlalchemy import func, select

from polarproxy.store import CallResult, EpisodeStart, Store, StoreError
from polarproxy.store.bases import MIN_SHARED_TOKENS, shared_prefix_bytes
from polarproxy.store.schema import calls as C


def _finish(store, cid, output):
    store.finish_call(cid, CallResult(status="ok", output_ids=output, output_logprobs=[-0.5] * len(output)))


def _token_bytes(store, episode_id) -> int:
    """Bytes of token IDs stored for an episode (prompt tails + outputs)."""
    with store.engine.connect() as conn:
        return conn.execute(
            select(func.sum(func.length(C.c.prompt_tail_ids) + func.length(C.c.output_ids))).where(
                C.c.episode_id == episode_id
            )
        ).scalar_one()


def _t2_episode(store, call_start, episode, turns: int, *, hint: bool, seed: int = 0):
    """An agent loop: each prompt is the previous prompt + its output + new tokens (what T2 builds)."""
    rng = random.Random(seed)
    prompt = [rng.randrange(150_000) for _ in range(50)]
    records = []
    prev = None
    for turn in range(turns):
        cid, _ = store.begin_call(
            call_start(episode, prompt_ids=prompt, extended_from=prev if hint else None)
        )
        output = [rng.randrange(150_000) for _ in range(rng.randint(1, 30))]
        _finish(store, cid, output)
        records.append((cid, prompt, output))
        prev = cid
        prompt = [*prompt, *output, *(rng.randrange(150_000) for _ in range(rng.randint(3, 40)))]
        del turn
    return records


@pytest.mark.parametrize("hint", [True, False], ids=["t2-hint", "detected"])
def test_an_episode_stores_each_distinct_token_once_and_reads_back_exactly(store, episode, call_start, hint):
    records = _t2_episode(store, call_start, episode, 40, hint=hint)
    calls = store.list_calls(episode)
    assert [c.prompt_ids for c in calls] == [p for _, p, _ in records]
    assert [c.output_ids for c in calls] == [o for _, _, o in records]
    assert [c.prompt_base_call_id for c in calls] == [None] + [cid for cid, _, _ in records[:-1]]
    assert [c.prompt_base_len for c in calls] == [0] + [len(p) + len(o) for _, p, o in records[:-1]]
    # the distinct tokens: the last prompt plus the last output, each stored once
    _, last_prompt, last_output = records[-1]
    assert _token_bytes(store, episode) == 4 * (len(last_prompt) + len(last_output))
    assert store.get_episode(episode).tokens == sum(len(p) + len(o) for _, p, o in records)


def test_a_hint_whose_tokens_differ_is_not_trusted(store, episode, call_start):
    base, _ = store.begin_call(call_start(episode, prompt_ids=list(range(100))))
    _finish(store, base, [500, 501])
    # claims to extend `base`, but its tokens diverge at index 60 (e.g. a re-tokenized history)
    prompt = [*range(60), 7, 7, 7, *range(63, 100), 500, 501, 9]
    cid, _ = store.begin_call(call_start(episode, prompt_ids=prompt, extended_from=base))
    call = store.get_call(cid)
    assert call.prompt_ids == prompt
    assert (call.prompt_base_call_id, call.prompt_base_len) == (base, 60)  # only the tokens that are equal


def test_a_hinted_base_length_is_verified_too(store, episode, call_start):
    base, _ = store.begin_call(call_start(episode, prompt_ids=list(range(40))))
    _finish(store, base, [1, 2, 3])
    prompt = [*range(40), 1, 2, 99]
    cid, _ = store.begin_call(
        call_start(episode, prompt_ids=prompt, prompt_base_call_id=base, prompt_base_len=43)
    )  # wrong: only 42 tokens are shared
    call = store.get_call(cid)
    assert call.prompt_ids == prompt and (call.prompt_base_call_id, call.prompt_base_len) == (base, 42)


def test_prompts_sharing_only_a_system_prompt_store_a_partial_reference(store, episode, call_start):
    system = list(range(1000, 1200))
    a, _ = store.begin_call(call_start(episode, prompt_ids=[*system, 1, 2, 3]))
    _finish(store, a, [4])
    sub = [*system, 7, 8, 9]  # a sub-agent with the same system prompt
    b, _ = store.begin_call(call_start(episode, prompt_ids=sub))
    call = store.get_call(b)
    assert call.prompt_ids == sub and (call.prompt_base_call_id, call.prompt_base_len) == (a, 200)


def test_a_call_in_flight_can_be_a_base_for_its_prompt(store, episode, call_start):
    prompt = list(range(300))
    a, _ = store.begin_call(call_start(episode, prompt_ids=prompt))  # not finished yet
    b, _ = store.begin_call(call_start(episode, prompt_ids=prompt))  # a retry of the same prompt
    assert store.get_call(b).prompt_ids == prompt
    assert (store.get_call(b).prompt_base_call_id, store.get_call(b).prompt_base_len) == (a, 300)
    _finish(store, a, [1, 2])
    assert store.get_call(b).prompt_ids == prompt


def test_short_and_unrelated_prompts_are_stored_whole(store, episode, call_start):
    a, _ = store.begin_call(call_start(episode, prompt_ids=list(range(100))))
    _finish(store, a, [1])
    short, _ = store.begin_call(call_start(episode, prompt_ids=list(range(MIN_SHARED_TOKENS - 1))))
    other, _ = store.begin_call(call_start(episode, prompt_ids=list(range(500, 600))))
    assert store.get_call(short).prompt_base_call_id is None
    assert store.get_call(other).prompt_base_call_id is None


def test_calls_of_other_episodes_are_never_bases(store, episode, call_start):
    a, _ = store.begin_call(call_start(episode, prompt_ids=list(range(100))))
    _finish(store, a, [1])
    other = store.create_episode(EpisodeStart(command=[]))
    b, _ = store.begin_call(call_start(other, prompt_ids=[*range(100), 1, 5], extended_from=a))
    assert store.get_call(b).prompt_base_call_id is None
    assert store.get_call(b).prompt_ids == [*range(100), 1, 5]


def test_a_base_written_by_another_store_is_read_back_and_verified(store_url, call_start):
    with Store.open(store_url) as first:
        ep = first.create_episode(EpisodeStart(command=[]))
        a, _ = first.begin_call(call_start(ep, prompt_ids=list(range(64))))
        _finish(first, a, [7, 8])
    with Store.open(store_url) as second:  # remembers nothing: the hint's tokens come from the database
        b, _ = second.begin_call(call_start(ep, prompt_ids=[*range(64), 7, 8, 9], extended_from=a))
        call = second.get_call(b)
        assert call.prompt_ids == [*range(64), 7, 8, 9]
        assert (call.prompt_base_call_id, call.prompt_base_len) == (a, 66)


def test_writes_rolled_back_in_a_batch_are_never_used_as_bases(store, episode, call_start):
    prompt = list(range(100))
    with pytest.raises(RuntimeError), store.batch():
        store.begin_call(call_start(episode, prompt_ids=prompt))
        raise RuntimeError("the group commit failed")
    assert store.list_calls(episode) == []
    cid, seq = store.begin_call(call_start(episode, prompt_ids=prompt))
    assert seq == 0 and store.get_call(cid).prompt_base_call_id is None
    assert store.get_call(cid).prompt_ids == prompt


def test_a_batch_can_use_a_base_written_earlier_in_the_same_batch(store, episode, call_start):
    with store.batch():
        a, _ = store.begin_call(call_start(episode, prompt_ids=list(range(100))))
        _finish(store, a, [1, 2])
    with store.batch():
        b, _ = store.begin_call(call_start(episode, prompt_ids=[*range(100), 1, 2, 3], extended_from=a))
    assert store.get_call(b).prompt_ids == [*range(100), 1, 2, 3]
    assert store.get_call(b).prompt_base_len == 102


def test_a_base_output_cannot_change_once_later_calls_use_it(store, episode, call_start):
    a, _ = store.begin_call(call_start(episode, prompt_ids=list(range(50))))
    _finish(store, a, [1, 2])
    b, _ = store.begin_call(call_start(episode, prompt_ids=[*range(50), 1, 2, 3], extended_from=a))
    assert store.get_call(b).prompt_base_len == 52
    _finish(store, a, [1, 2])  # a replay of the same result is fine
    with pytest.raises(StoreError, match="output IDs cannot change"):
        _finish(store, a, [1, 9])
    assert store.get_call(a).output_ids == [1, 2]
    assert store.get_call(b).prompt_ids == [*range(50), 1, 2, 3]


def test_reading_a_whole_episode_loads_no_base_twice(store, episode, call_start, monkeypatch):
    records = _t2_episode(store, call_start, episode, 60, hint=True)
    loads: list[str] = []
    real = store._load_token_row
    monkeypatch.setattr(store, "_load_token_row", lambda cid: loads.append(cid) or real(cid))
    assert [c.prompt_ids for c in store.iter_calls([episode])] == [p for _, p, _ in records]
    assert loads == []  # every base was the call read just before it: nothing read again


def test_random_branching_episodes_read_back_exactly(store, call_start):
    """Sub-agents, retries, edited history and compaction, interleaved across episodes."""
    rng = random.Random(5)
    expected: dict[str, list[int]] = {}
    sequences: dict[str, list[list[int]]] = {}
    episodes = [store.create_episode(EpisodeStart(command=[])) for _ in range(3)]
    for _ in range(120):
        ep = rng.choice(episodes)
        seen = sequences.setdefault(ep, [])
        kind = rng.random()
        if seen and kind < 0.6:  # extend an earlier call's prompt + output
            base = rng.choice(seen)
            prompt = [*base, *(rng.randrange(50) for _ in range(rng.randint(0, 20)))]
        elif seen and kind < 0.8:  # cut an earlier sequence somewhere and go on differently
            base = rng.choice(seen)
            prompt = [
                *base[: rng.randint(0, len(base))],
                *(rng.randrange(50) for _ in range(rng.randint(1, 9))),
            ]
        else:
            prompt = [rng.randrange(50) for _ in range(rng.randint(1, 40))]
        cid, _ = store.begin_call(call_start(ep, prompt_ids=prompt))
        output = [rng.randrange(50) for _ in range(rng.randint(0, 5))]
        if rng.random() < 0.9:
            _finish(store, cid, output)
            seen.append([*prompt, *output])
        else:
            seen.append(prompt)  # left in flight
        expected[cid] = prompt
    assert {c.id: c.prompt_ids for c in store.iter_calls()} == expected
    for cid in rng.sample(sorted(expected), 10):
        assert store.get_call(cid).prompt_ids == expected[cid]
    with store.engine.connect() as conn:
        assert (
            conn.execute(select(func.count()).where(C.c.prompt_base_call_id.is_not(None))).scalar_one() > 30
        )


@pytest.mark.parametrize(
    ("a", "b", "n"),
    [
        (b"", b"", 0),
        (b"abc", b"abd", 2),
        (b"abc", b"abc", 3),
        (b"ab", b"abc", 2),
        (b"x" * 70000, b"x" * 69999 + b"y", 69999),
    ],
)
def test_shared_prefix_bytes(a, b, n):
    assert shared_prefix_bytes(a, b) == n == shared_prefix_bytes(b, a)


def _stored_body_bytes(store, episode_id) -> int:
    with store.engine.connect() as conn:
        return conn.execute(
            select(
                func.sum(
                    func.length(C.c.request_body)
                    + func.coalesce(func.length(C.c.conversation_json), 0)
                    + func.coalesce(func.length(C.c.bodies_delta), 0)
                )
            ).where(C.c.episode_id == episode_id)
        ).scalar_one()


def test_request_bodies_that_resend_the_history_are_stored_as_edits_and_read_back_exactly(
    store, store_url, episode, call_start
):
    rng = random.Random(3)
    messages = [{"role": "system", "content": "You are a coding agent. " * 20}]
    tools = [{"name": "read_file", "parameters": {"path": "string"}}]
    prompt, sent = list(range(100)), []
    for turn in range(40):
        messages.append({"role": "user", "content": f"turn {turn}: " + "word " * rng.randint(5, 60)})
        body = orjson.dumps({"model": "m", "messages": messages, "tools": tools, "stream": True}).decode()
        conv = {"messages": list(messages), "tools": tools}
        cid, _ = store.begin_call(
            call_start(episode, prompt_ids=prompt, request_body=body, conversation=conv)
        )
        _finish(store, cid, [7, 8])
        sent.append((cid, body, conv))
        messages.append({"role": "assistant", "content": "answer " * rng.randint(5, 40)})
        prompt = [*prompt, 7, 8, *range(rng.randint(5, 30))]
    calls = store.list_calls(episode)
    assert [(c.id, c.request_body, c.conversation) for c in calls] == sent
    with Store.open(store_url) as fresh:  # nothing remembered: every base read back from the database
        assert all(fresh.get_call(cid).request_body == body for cid, body, _ in sent[::7])
    whole = sum(len(body) + len(orjson.dumps(conv)) for _, body, conv in sent)
    last = len(sent[-1][1]) + len(orjson.dumps(sent[-1][2]))
    stored = _stored_body_bytes(store, episode)
    assert stored < last < whole / 10  # linear: less than the last call's bodies alone, not their sum


def test_bodies_unlike_the_bases_read_back_exactly(store, episode, call_start):
    a, _ = store.begin_call(call_start(episode, prompt_ids=list(range(50)), request_body="x" * 500))
    _finish(store, a, [1])
    b, _ = store.begin_call(
        call_start(episode, prompt_ids=[*range(50), 1, 2], request_body="y" * 400, conversation=None)
    )
    store.begin_call(call_start(episode, prompt_ids=[*range(50), 1, 3], request_body="", conversation={}))
    assert store.get_call(b).prompt_base_call_id == a  # the tokens are a reference
    assert [(x.request_body, x.conversation) for x in store.list_calls(episode)[1:]] == [
        ("y" * 400, None),
        ("", {}),
    ]
