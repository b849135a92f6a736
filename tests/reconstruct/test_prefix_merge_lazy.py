"""prefix-merge over lazily rebuilt prompts (Store.iter_calls(lazy_prompts=True), what `export` reads): the
same trajectories as over whole prompts, with only the leaves' prompt ID lists built."""

from __future__ import annotations

import random

import pytest
from episode_factory import record_call

from polarproxy.reconstruct import assert_round_trip, prefix_merge
from polarproxy.store import EpisodeStart, Store
from polarproxy.store.rebuild import LazyPromptCall, Rebuilder


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "lazy.db")
    yield s
    s.close()


def _random_episodes(store: Store, seed: int) -> None:
    """Chains, sub-agents and retries from shared prefixes, breaks, failed calls: prompts long enough
    (>= 8 tokens) that the store keeps most of them as references to earlier calls."""
    rng = random.Random(seed)
    for _ in range(3):
        eid = store.create_episode(EpisodeStart(command=["agent"]))
        seen: list[tuple[str, list[int]]] = []
        for _ in range(25):
            kind = rng.random()
            if seen and kind < 0.7:  # extend an earlier call's prompt + output (hint right or missing)
                base_id, base = rng.choice(seen)
                prompt = [*base, *(rng.randrange(500) for _ in range(rng.randint(0, 12)))]
                hint = base_id if rng.random() < 0.8 else None
            elif seen and kind < 0.85:  # rewritten history: a cut of an earlier sequence, then new tokens
                _, base = rng.choice(seen)
                prompt = [*base[: rng.randint(0, len(base))], *(rng.randrange(500) for _ in range(9))]
                hint = None
            else:
                prompt = [rng.randrange(500) for _ in range(rng.randint(8, 30))]
                hint = None
            output = [rng.randrange(500) for _ in range(rng.randint(0, 6))]
            status = "ok" if rng.random() < 0.9 else "failed"
            cid = record_call(store, eid, prompt, output, status=status, extended_from=hint)
            seen.append((cid, [*prompt, *output]))


@pytest.mark.parametrize("include_failed", [False, True])
def test_lazy_prompts_give_the_same_trajectories_as_whole_prompts(store, include_failed):
    _random_episodes(store, seed=3)
    episodes = {e.id: e for e in store.list_episodes(limit=None)}
    whole = list(prefix_merge(store.iter_calls(), episodes=episodes, include_failed=include_failed))
    lazy = list(
        prefix_merge(store.iter_calls(lazy_prompts=True), episodes=episodes, include_failed=include_failed)
    )
    assert lazy == whole
    assert len(whole) > 6  # branches and breaks, not one chain per episode
    calls = {c.id: c for c in store.iter_calls()}
    for t in lazy:
        assert_round_trip(t, [calls[c] for c in t.call_ids])
    assert sorted(c for t in lazy for c in t.call_ids) == sorted(
        c.id for c in calls.values() if c.status == "ok" or include_failed
    )


def test_a_linear_chain_builds_only_the_leaf_prompt(store, monkeypatch):
    eid = store.create_episode(EpisodeStart(command=["agent"]))
    prompt, prev = list(range(100, 140)), None
    for i in range(12):
        output = [1000 + i, 2000 + i]
        prev = record_call(store, eid, prompt, output, extended_from=prev if i % 2 else None)
        prompt = [*prompt, *output, *range(3000 + 10 * i, 3008 + 10 * i)]
    built: list[str] = []
    real = Rebuilder.prompt

    def counting(self, row):
        built.append(row.id)
        return real(self, row)

    monkeypatch.setattr(Rebuilder, "prompt", counting)
    (t,) = prefix_merge(store.iter_calls(lazy_prompts=True))
    assert built == [prev]  # the leaf's, for its input_ids; every other call was merged by its reference
    assert len(t.call_ids) == 12 and len(t.input_ids) == 40 + 11 * 10 + 2


def test_lazy_calls_read_back_the_prompts_the_store_holds(store):
    _random_episodes(store, seed=8)
    whole = list(store.iter_calls())
    lazy = list(store.iter_calls(lazy_prompts=True))
    assert all(isinstance(c, LazyPromptCall) for c in lazy)
    assert [c.prompt_len for c in lazy] == [len(c.prompt_ids) for c in whole]
    assert [c.prompt_ids for c in reversed(lazy)] == [c.prompt_ids for c in reversed(whole)]  # any order
    assert [c.output_ids for c in lazy] == [c.output_ids for c in whole]
