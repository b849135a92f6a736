"""prefix-merge on hand-built episodes in a real SQLite store: chains, branches, breaks, failures."""

from __future__ import annotations

import pytest
from episode_factory import logprobs_for, record_call

from polarproxy.reconstruct import assert_round_trip, get_strategy, per_request, prefix_merge, reconstruct
from polarproxy.store import EpisodeStart, Store


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "pm.db")
    yield s
    s.close()


def _episode(store: Store, reward: float | None = None, group: str | None = None) -> str:
    eid = store.create_episode(EpisodeStart(command=["agent"], harness="codex", group_id=group))
    if reward is not None:
        store.set_reward(eid, reward)
    return eid


def _merged(store: Store, **kw):
    episodes = {e.id: e for e in store.list_episodes(limit=None)}
    trajs = list(prefix_merge(store.iter_calls(), episodes=episodes, **kw))
    calls = {c.id: c for c in store.iter_calls()}
    for t in trajs:
        assert_round_trip(t, [calls[c] for c in t.call_ids])
    return trajs


def test_a_linear_chain_is_one_trajectory_with_the_gaps_masked(store):
    eid = _episode(store, reward=0.5, group="g")
    a = record_call(store, eid, [1, 2, 3], [10, 11])
    b = record_call(store, eid, [1, 2, 3, 10, 11, 4, 5], [12], extended_from=a)
    c = record_call(
        store, eid, [1, 2, 3, 10, 11, 4, 5, 12, 6], [13, 14], finish_reason="length", extended_from=b
    )
    (t,) = _merged(store)
    assert t.call_ids == [a, b, c] and t.strategy == "prefix-merge"
    assert t.input_ids == [1, 2, 3, 10, 11, 4, 5, 12, 6, 13, 14]
    assert t.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    lp_a, lp_b, lp_c = logprobs_for([10, 11]), logprobs_for([12]), logprobs_for([13, 14])
    assert t.logprobs == [None] * 3 + lp_a + [None] * 2 + lp_b + [None] + lp_c
    assert t.call_spans == [(3, 5), (7, 8), (9, 11)]
    assert t.metadata["call_output_spans"] == [[3, 5], [7, 8], [9, 11]]
    assert (t.finish_reason, t.reward, t.group_id) == ("length", 0.5, "g")
    assert t.messages[-1]["content"] == "2 tokens"  # the last call's conversation and reply


def test_merging_is_decided_by_tokens_not_by_the_recorded_hint(store):
    eid = _episode(store)
    a = record_call(store, eid, [1, 2], [10])
    other = record_call(store, eid, [7], [8])
    # No hint, and a wrong hint (pointing at a call whose tokens are not a prefix): both merge after `a`.
    b = record_call(store, eid, [1, 2, 10, 3], [11])
    c = record_call(store, eid, [1, 2, 10, 3, 11, 4], [12], extended_from=other)
    trajs = _merged(store)
    assert [t.call_ids for t in trajs] == [[a, b, c], [other]]


def test_the_longest_earlier_sequence_wins_over_a_shorter_hint(store):
    eid = _episode(store)
    a = record_call(store, eid, [1], [10])
    b = record_call(store, eid, [1, 10, 2], [11], extended_from=a)
    c = record_call(store, eid, [1, 10, 2, 11, 3], [12], extended_from=a)  # hint says a; b is longer
    assert [t.call_ids for t in _merged(store)] == [[a, b, c]]


def test_branches_give_one_trajectory_per_leaf_and_each_call_once(store):
    eid = _episode(store)
    root = record_call(store, eid, [1, 2], [10, 11])
    left = record_call(store, eid, [1, 2, 10, 11, 3], [20], extended_from=root)
    right = record_call(store, eid, [1, 2, 10, 11, 4], [30, 31], extended_from=root)  # a sub-agent
    retry = record_call(store, eid, [1, 2, 10, 11, 4], [32])  # a retry from the same prefix
    deep = record_call(store, eid, [1, 2, 10, 11, 3, 20, 5], [21], extended_from=left)
    trajs = _merged(store)
    assert [t.call_ids for t in trajs] == [[root, left, deep], [right], [retry]]
    # In the other branches the shared root is context the model saw: masked, no logprobs.
    second = trajs[1]
    assert second.input_ids == [1, 2, 10, 11, 4, 30, 31]
    assert second.loss_mask == [0, 0, 0, 0, 0, 1, 1]
    assert second.logprobs[:5] == [None] * 5
    assert sorted(c for t in trajs for c in t.call_ids) == sorted([root, left, right, retry, deep])


def test_a_break_starts_a_new_trajectory_and_drops_nothing(store):
    eid = _episode(store)
    a = record_call(store, eid, [1, 2], [10])
    b = record_call(store, eid, [1, 2, 10, 3], [11], extended_from=a)
    compacted = record_call(store, eid, [9, 8, 7], [12])  # history rewritten: extends nothing
    d = record_call(store, eid, [9, 8, 7, 12, 6], [13], extended_from=compacted)
    side = record_call(store, eid, [5], [14], tools=False)  # a title request between turns
    trajs = _merged(store)
    assert [t.call_ids for t in trajs] == [[a, b], [compacted, d], [side]]
    assert trajs[2].metadata["has_tools"] is False


def test_failed_calls_follow_include_failed_and_in_flight_calls_never_appear(store):
    eid = _episode(store)
    a = record_call(store, eid, [1], [10])
    failed = record_call(store, eid, [1, 10, 2], [11], status="failed", extended_from=a)
    b = record_call(store, eid, [1, 10, 2, 11, 3], [12], extended_from=failed)
    flying = record_call(store, eid, [1, 10, 2, 11, 3, 12, 4], [], status="in_flight", extended_from=b)
    without = _merged(store)
    assert [t.call_ids for t in without] == [[a, b]]
    # The failed call's tokens are in b's prompt: masked context.
    assert without[0].loss_mask == [0, 1, 0, 0, 0, 1]
    with_failed = _merged(store, include_failed=True)
    assert [t.call_ids for t in with_failed] == [[a, failed, b]]
    assert flying not in {c for t in with_failed for c in t.call_ids}


def test_empty_outputs_and_calls_without_logprobs_round_trip(store):
    eid = _episode(store)
    a = record_call(store, eid, [1, 2], [], finish_reason="length")
    b = record_call(store, eid, [1, 2, 3], [10, 11], with_logprobs=False, extended_from=a)
    c = record_call(store, eid, [1, 2, 3, 10, 11, 4], [], extended_from=b)
    (t,) = _merged(store)
    assert t.call_ids == [a, b, c]
    assert t.call_spans == [(2, 2), (3, 5), (6, 6)]
    assert t.loss_mask == [0, 0, 0, 1, 1, 0] and t.logprobs == [None] * 6


def test_calls_without_tokens_never_absorb_later_calls(store):
    """Text-fidelity calls (intercept mode) hold no token IDs: each is its own trajectory."""
    eid = _episode(store)
    ids = [record_call(store, eid, [], []) for _ in range(3)]
    assert [t.call_ids for t in _merged(store)] == [[i] for i in ids]


def test_episodes_are_merged_separately_and_take_their_own_reward(store):
    e1, e2 = _episode(store, reward=1.0, group="g"), _episode(store, reward=0.0, group="g")
    a = record_call(store, e1, [1, 2], [3])
    b = record_call(store, e2, [1, 2, 3, 4], [5])  # same tokens, another episode: not merged
    trajs = _merged(store)
    assert [(t.call_ids, t.episode_id, t.reward) for t in trajs] == [([a], e1, 1.0), ([b], e2, 0.0)]


def test_the_row_count_and_tokens_compared_with_per_request(store):
    eid = _episode(store)
    prompt = [1, 2]
    prev = None
    for turn in range(5):
        prev = record_call(store, eid, prompt, [100 + turn], extended_from=prev)
        prompt = [*prompt, 100 + turn, 50 + turn]
    merged, single = _merged(store), list(per_request(store.iter_calls()))
    assert len(merged) == 1 and len(single) == 5
    assert sum(t.trainable_tokens for t in merged) == sum(t.trainable_tokens for t in single) == 5
    assert sum(end for t in merged for _, end in t.call_spans) == sum(len(t.input_ids) for t in single)


def test_prefix_merge_is_registered_by_name():
    assert get_strategy("prefix-merge") is prefix_merge
    assert list(reconstruct("prefix-merge", [])) == []
    with pytest.raises(
        ValueError, match=r"Unknown strategy 'merge'. Must be one of 'per-request', 'prefix-merge'"
    ):
        get_strategy("merge")


def test_the_one_chain_shortcut_finds_the_paths_the_parent_search_finds(store, monkeypatch):
    """leaf_paths skips the parent search when every call is stored as an extension of the one before it;
    on such chains (with empty outputs and ties) and on episodes that are not one (a hint to an older call,
    branches, a break, prompts too short to be stored against a base), the paths are the search's."""
    import importlib

    from polarproxy.store.token_calls import iter_token_calls

    pm = importlib.import_module("polarproxy.reconstruct.prefix_merge")  # the module, not the function
    p = list(range(100, 110))  # long enough to be stored against a base (call_writes.MIN_REFERENCE_TOKENS)
    chain = _episode(store)
    a = record_call(store, chain, p, [])
    b = record_call(store, chain, p, [], extended_from=a)  # the same full sequence: a tie
    c = record_call(store, chain, [*p, 3], [10, 11], extended_from=b)
    record_call(store, chain, [*p, 3, 10, 11, 4], [12], extended_from=c)
    older = _episode(store)  # the hint names an older call: stored against it, not against the call before
    e = record_call(store, older, p, [1])
    record_call(store, older, [*p, 1], [], extended_from=e)
    f = record_call(store, older, [*p, 1, 3], [10, 11], extended_from=e)
    record_call(store, older, [*p, 1, 3, 10, 11, 4], [12], extended_from=f)
    branched = _episode(store)
    d = record_call(store, branched, p, [10])
    record_call(store, branched, [*p, 10, 3], [11], extended_from=d)
    record_call(store, branched, [*p, 10, 5], [12], extended_from=d)
    broken = _episode(store)
    g = record_call(store, broken, p, [2])
    record_call(store, broken, [7, 8], [9])
    record_call(store, broken, [*p, 2, 5], [6], extended_from=g)
    short = _episode(store)
    h = record_call(store, short, [1, 2], [3])
    record_call(store, short, [1, 2, 3, 4], [5], extended_from=h)
    episodes = (chain, older, branched, broken, short)

    def paths(read) -> dict[str, list[tuple[list[str], list[str]]]]:
        out: dict[str, list[tuple[list[str], list[str]]]] = {}
        for eid in episodes:
            calls = list(read([eid]))
            out[eid] = [([x.id for x in p], [x.id for x in o]) for p, o in pm.leaf_paths(calls)]
        return out

    readers = (store.iter_calls, lambda ids: iter_token_calls(store, ids))
    shortcut = [paths(r) for r in readers]
    assert [pm._one_chain(list(store.iter_calls([eid]))) for eid in episodes] == [True] + [False] * 4
    assert len(shortcut[0][chain]) == 1 and shortcut[0][chain][0][0][1] == b
    assert shortcut[0] == shortcut[1]
    monkeypatch.setattr(pm, "_one_chain", lambda calls: False)
    assert [paths(r) for r in readers] == shortcut
