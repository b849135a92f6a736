"""Prompts stored as `full_sequence(base)[:prompt_base_len] + tail` read back whole.

Today begin_call stores every prompt in full; these rows are inserted directly, as the later
prefix-storing change will write them."""

import orjson
import pytest

from polarproxy.store import StoreError
from polarproxy.store.arrays import pack_ids, pack_logprobs
from polarproxy.store.ids import new_call_id
from polarproxy.store.schema import calls


def insert_call(store, episode_id, seq, *, base=None, base_len=0, tail=(), output=(), status="ok"):
    cid = new_call_id()
    with store.engine.begin() as conn:
        conn.execute(
            calls.insert().values(
                id=cid,
                episode_id=episode_id,
                seq=seq,
                dialect="openai_chat",
                method="POST",
                path="/v1/chat/completions",
                model="m",
                stream=False,
                status=status,
                request_headers_json=orjson.dumps({}).decode(),
                request_body="{}",
                prompt_base_call_id=base,
                prompt_base_len=base_len,
                prompt_tail_ids=pack_ids(list(tail)),
                prompt_len=base_len + len(tail),
                output_ids=pack_ids(list(output)),
                output_logprobs=pack_logprobs([-1.0] * len(output)),
                output_len=len(output),
                backend="",
                backend_kind="",
                fidelity="tokens",
                render_mode="extended" if base else "fresh",
                started_at=float(seq),
            )
        )
    return cid


def test_prompt_is_rebuilt_from_its_base_calls_prompt_and_output(store, episode):
    root = insert_call(store, episode, 0, tail=[1, 2, 3], output=[4, 5])
    # extends root's whole sequence (prompt + output) with new tokens
    child = insert_call(store, episode, 1, base=root, base_len=5, tail=[6, 7], output=[8])
    # extends child, but keeps only part of it (e.g. the template dropped the last turn's tail)
    grandchild = insert_call(store, episode, 2, base=child, base_len=6, tail=[9], output=[10, 11])
    expected = {root: [1, 2, 3], child: [1, 2, 3, 4, 5, 6, 7], grandchild: [1, 2, 3, 4, 5, 6, 9]}
    for cid, prompt in expected.items():
        assert store.get_call(cid).prompt_ids == prompt  # fresh reader: bases loaded from the database
    assert {c.id: c.prompt_ids for c in store.iter_calls()} == expected  # streaming reader: bases cached
    assert store.get_call(grandchild).output_ids == [10, 11]
    assert [(e.calls, e.tokens) for e in store.list_episodes()] == [(3, 5 + 8 + 9)]


def test_base_outside_the_read_selection_is_still_found(store, episode):
    root = insert_call(store, episode, 0, tail=[1, 2], output=[3], status="failed")
    child = insert_call(store, episode, 1, base=root, base_len=3, tail=[4], output=[5])
    assert [c.prompt_ids for c in store.iter_calls(status="ok")] == [[1, 2, 3, 4]]
    assert store.get_call(child).prompt_ids == [1, 2, 3, 4]


def test_a_long_chain_rebuilds_without_recursion(store, episode):
    prev = insert_call(store, episode, 0, tail=[0], output=[1])
    for seq in range(1, 1500):
        prev = insert_call(
            store, episode, seq, base=prev, base_len=2 * seq, tail=[2 * seq], output=[2 * seq + 1]
        )
    # call n: prompt [0, 1, ..., 2n], output [2n + 1]; 1500 levels deep, past Python's recursion limit
    assert store.get_call(prev).prompt_ids == list(range(2 * 1499 + 1))


def test_base_len_longer_than_the_base_raises(store, episode):
    root = insert_call(store, episode, 0, tail=[1, 2], output=[3])
    bad = insert_call(store, episode, 1, base=root, base_len=4, tail=[9])
    with pytest.raises(StoreError, match=r"takes 4 tokens from its base call .* which has only 3"):
        store.get_call(bad)
