"""T3 and T4 for both strategies over generated episodes recorded in a real SQLite store.

Episodes mix linear chains, branches (several calls extending one call), retries from the same prompt,
breaks (a prompt that extends nothing), truncated turns (finish reason length), empty outputs, calls
without logprobs, failed / aborted / in-flight calls, and `extended_from` hints that are right, missing
or wrong. New tokens are drawn from a counter, so a prompt extends exactly the calls it was built from.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from episode_factory import record_call
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polarproxy.reconstruct import assert_round_trip, reconstruct
from polarproxy.store import Call, EpisodeStart, Store

STATUSES = ("ok", "ok", "ok", "ok", "failed", "aborted", "in_flight")


@dataclass(frozen=True)
class Step:
    kind: str  # 'extend' an earlier call, 'retry' an earlier call's prompt, or 'fresh' (a break)
    target: int  # which earlier call (modulo their number)
    tail: int  # new tokens after the extended call's output
    output: int  # sampled tokens (0: an empty output)
    status: str
    finish: str
    hint: str  # 'right', 'none' or 'wrong'
    logprobs: bool


steps = st.builds(
    Step,
    kind=st.sampled_from(("extend", "extend", "extend", "retry", "fresh")),
    target=st.integers(0, 50),
    tail=st.integers(0, 3),
    output=st.sampled_from((0, 1, 2, 3, 1, 2, 3)),
    status=st.sampled_from(STATUSES),
    finish=st.sampled_from(("stop", "length", "tool_calls")),
    hint=st.sampled_from(("right", "right", "none", "wrong")),
    logprobs=st.booleans(),
)
episodes = st.lists(st.lists(steps, min_size=1, max_size=10), min_size=1, max_size=3)


def _record(store: Store, plan: list[list[Step]]) -> None:
    counter = iter(range(1000, 10**6))

    def fresh(n: int) -> list[int]:
        return [next(counter) for _ in range(n)]

    for episode_steps in plan:
        eid = store.create_episode(EpisodeStart(command=["agent"]))
        made: list[tuple[str, list[int], list[int]]] = []  # (call id, prompt, output)
        for step in episode_steps:
            output = [] if step.status == "in_flight" else fresh(step.output)
            hint = None
            if step.kind == "fresh" or not made:
                prompt = fresh(1 + step.tail)
            else:
                base_id, base_prompt, base_output = made[step.target % len(made)]
                if step.kind == "extend":
                    prompt = base_prompt + base_output + fresh(step.tail)
                else:
                    prompt = list(base_prompt)
                if step.hint == "right":
                    hint = base_id
                elif step.hint == "wrong":
                    hint = made[(step.target + 1) % len(made)][0]
            call_id = record_call(
                store,
                eid,
                prompt,
                output,
                status=step.status,
                finish_reason=None if step.status == "in_flight" else step.finish,
                with_logprobs=step.logprobs,
                extended_from=hint,
            )
            made.append((call_id, prompt, output))


def _exported(calls: list[Call], include_failed: bool) -> list[Call]:
    allowed = {"ok", "failed", "aborted", "interrupted"} if include_failed else {"ok"}
    return [c for c in calls if c.status in allowed]


def _extends(later: Call, earlier: Call) -> bool:
    full = earlier.prompt_ids + earlier.output_ids
    return bool(full) and later.prompt_ids[: len(full)] == full


def _check(strategy: str, calls: list[Call], include_failed: bool) -> None:
    by_id = {c.id: c for c in calls}
    exported = _exported(calls, include_failed)
    trajs = list(reconstruct(strategy, calls, include_failed=include_failed))

    # T3: every exported call in exactly one trajectory; nothing else.
    counts = Counter(c for t in trajs for c in t.call_ids)
    assert counts == Counter(c.id for c in exported)

    for t in trajs:
        own = [by_id[c] for c in t.call_ids]
        assert all(c.episode_id == t.episode_id for c in own)
        assert_round_trip(t, own)  # T4, as the package states it
        # T4, restated from the row alone: trainable tokens are the calls' outputs, in order, with logprobs.
        trainable = [(i, lp) for i, m, lp in zip(t.input_ids, t.loss_mask, t.logprobs, strict=True) if m]
        expected = [
            (i, lp)
            for c in own
            for i, lp in zip(c.output_ids, c.output_logprobs or [None] * len(c.output_ids), strict=True)
        ]
        assert trainable == expected
        # ... and the masked tokens are what the model saw: before the first call's output, its prompt;
        # between two calls' outputs, the rest of the later call's prompt.
        end = 0
        for c in own:
            p = len(c.prompt_ids)
            assert t.input_ids[end:p] == c.prompt_ids[end:]
            assert set(t.loss_mask[end:p]) <= {0} and set(t.logprobs[end:p]) <= {None}
            end = p + len(c.output_ids)
        assert end == len(t.input_ids)

    assert sum(t.trainable_tokens for t in trajs) == sum(len(c.output_ids) for c in exported)
    if strategy == "per-request":
        assert len(trajs) == len(exported)
    elif all(c.output_ids for c in exported):
        # With unique tokens and no empty outputs, the calls form a tree by extension: one trajectory per
        # exported call that no later exported call of its episode extends.
        leaves = [
            c
            for i, c in enumerate(exported)
            if not any(d.episode_id == c.episode_id and _extends(d, c) for d in exported[i + 1 :])
        ]
        assert len(trajs) == len(leaves)
        assert sorted(t.call_ids[-1] for t in trajs) == sorted(c.id for c in leaves)


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=episodes, include_failed=st.booleans())
def test_t3_and_t4_hold_for_both_strategies_on_generated_episodes(plan, include_failed):
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp) / "gen.db")
        try:
            _record(store, plan)
            calls = list(store.iter_calls())
        finally:
            store.close()
    assert len(calls) == sum(len(s) for s in plan)
    for strategy in ("per-request", "prefix-merge"):
        _check(strategy, calls, include_failed)


@settings(max_examples=15, deadline=None, database=None)
@given(
    hints=st.lists(st.booleans(), min_size=1, max_size=12), tail=st.integers(0, 3), output=st.integers(1, 4)
)
def test_a_linear_chain_is_always_one_trajectory(hints, tail, output):
    """With or without the recorded hint, each call merges after the one before it."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp) / "chain.db")
        try:
            eid = store.create_episode(EpisodeStart(command=["agent"]))
            prompt, prev, ids = [1], None, []
            for turn, hint in enumerate(hints):
                out = [1000 * (turn + 1) + k for k in range(output)]
                prev = record_call(store, eid, prompt, out, extended_from=prev if hint else None)
                ids.append(prev)
                prompt = prompt + out + [7] * tail
            calls = list(store.iter_calls())
        finally:
            store.close()
    (traj,) = reconstruct("prefix-merge", calls)
    assert traj.call_ids == ids
    _check("prefix-merge", calls, include_failed=False)
