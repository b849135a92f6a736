"""Store.finish_calls: a run of finishes in one statement (the writer's group commit), all or none."""

from __future__ import annotations

import pytest

from polarproxy.store import StoreError
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
