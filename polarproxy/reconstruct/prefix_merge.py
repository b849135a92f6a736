"""The prefix-merge strategy: calls whose prompt extends an earlier call's prompt + output share one sequence.

Within an episode each exported call gets a parent: the earlier exported call whose full sequence (prompt +
output) its prompt starts with, decided by the token IDs themselves. The recorded `extended_from` (T2) is
tried first as a hint; a longer matching call wins over it, and without a verified hint the earlier calls
are searched longest first (on equal lengths the latest). Calls with no parent are roots, so the calls form
a forest: a linear agent loop is one chain, parallel sub-agents and retries from the same prefix are
branches, and a break (compaction, rewritten history, a side request) is a new root.

Each leaf's path from its root is one trajectory: the leaf's prompt + output, with the sampled tokens of
the calls it owns trainable and everything else masked (logprob None). T3 asks for every call in exactly
one trajectory, so a call shared by several leaf paths (the prefix of a branch) is owned by the first of
them in depth-first order (children by sequence number); in the other branches its tokens are context the
model saw, masked. Every leaf owns itself, so no trajectory is empty, and T4 holds for each: its trainable
tokens are exactly the sampled IDs of its `call_ids`, in order.

Failed, aborted and interrupted calls are exported only with `include_failed`, as in per-request; a call
that extends an excluded one attaches to the nearest exported call its prompt extends, with the excluded
call's tokens masked. A call with no tokens at all (text fidelity) never serves as a parent.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import groupby
from typing import Any

from polarproxy.reconstruct.per_request import is_exported, leaf_fields
from polarproxy.reconstruct.trajectory import SpanTrajectory, Trajectory, per_call_columns, span_logprobs
from polarproxy.store.rebuild import LazyPromptCall
from polarproxy.store.records import Call, Episode
from polarproxy.store.token_calls import TokenCall

STRATEGY = "prefix-merge"


def _prompt_len(call: Call | TokenCall) -> int:
    """The length of a call's prompt, without rebuilding a LazyPromptCall's or a TokenCall's IDs."""
    return call.prompt_len if isinstance(call, (LazyPromptCall, TokenCall)) else len(call.prompt_ids)


def _full_len(call: Call | TokenCall) -> int:
    if isinstance(call, TokenCall):
        return call.prompt_len + call.output_len
    return _prompt_len(call) + len(call.output_ids)


def extends(prompt: list[int], base: Call) -> bool:
    """Whether `prompt` starts with `base`'s prompt followed by its output (and `base` holds any tokens)."""
    p, o = len(base.prompt_ids), len(base.output_ids)
    if p + o == 0 or len(prompt) < p + o:
        return False
    # Cheap rejections before comparing whole slices: the last token of each segment.
    if p and prompt[p - 1] != base.prompt_ids[-1]:
        return False
    if o and prompt[p + o - 1] != base.output_ids[-1]:
        return False
    return prompt[:p] == base.prompt_ids and prompt[p : p + o] == base.output_ids


def _stored_as_extension(call: Call | TokenCall, base: Call | TokenCall) -> bool:
    """Whether the store keeps `call`'s prompt as `base`'s whole prompt + output followed by new tokens (its
    prompt reference, store/rebuild.py), so that `extends(call.prompt_ids, base)` holds by construction: the
    store rebuilt that prompt from those very tokens. Only lengths are compared, so no prompt is rebuilt."""
    whole = _full_len(base)
    return (
        call.prompt_base_call_id == base.id
        and call.prompt_base_len == whole > 0
        and _prompt_len(call) >= whole
    )


def _extends_call(call: Call | TokenCall, base: Call | TokenCall) -> bool:
    if _stored_as_extension(call, base):
        return True
    if isinstance(call, TokenCall):
        assert isinstance(base, TokenCall)
        return call.extends(base)
    assert not isinstance(base, TokenCall)
    return extends(call.prompt_ids, base)


def find_parent[AnyCall: (Call, TokenCall)](
    call: AnyCall,
    earlier: list[AnyCall],
    by_id: Mapping[str, AnyCall],
    full_lens: Sequence[int] | None = None,
) -> AnyCall | None:
    """The earlier call whose full sequence `call`'s prompt extends, the longest one; None for a root.
    `full_lens`: each earlier call's prompt + output length, when the caller has them."""
    lens = full_lens if full_lens is not None else [_full_len(c) for c in earlier]
    return _find_parent(call, earlier, len(earlier), by_id, lens, max(lens, default=0))


def _find_parent[AnyCall: (Call, TokenCall)](
    call: AnyCall,
    calls: Sequence[AnyCall],
    n: int,
    by_id: Mapping[str, AnyCall],
    full_lens: Sequence[int],
    longest: int,
) -> AnyCall | None:
    """find_parent among `calls[:n]`, whose full lengths are `full_lens[:n]` and at most `longest`."""
    hint = by_id.get(call.extended_from) if call.extended_from else None
    best = hint if hint is not None and hint.seq < call.seq and _extends_call(call, hint) else None
    floor = _full_len(best) if best is not None else 0
    if longest <= floor:  # nothing longer than the hint: the hint it is (an agent loop's every call)
        return best
    limit = _prompt_len(call)
    candidates = [c for c, k in zip(calls[:n], full_lens[:n], strict=True) if floor < k <= limit]
    candidates.sort(key=lambda c: (_full_len(c), c.seq), reverse=True)
    for cand in candidates:
        if _extends_call(call, cand):
            return cand
    return best


def _trajectory(path: list[Call], owned: list[Call], episode: Episode | None) -> Trajectory:
    leaf = path[-1]
    input_ids = leaf.prompt_ids + leaf.output_ids
    n = len(input_ids)
    loss_mask = [0] * n
    logprobs: list[float | None] = [None] * n
    spans: list[tuple[int, int]] = []
    for call in owned:
        p, o = _prompt_len(call), len(call.output_ids)
        loss_mask[p : p + o] = [1] * o
        logprobs[p : p + o] = call.output_logprobs if call.output_logprobs else [None] * o
        spans.append((p, p + o))
    fields = leaf_fields(leaf, episode)
    fields["metadata"]["call_output_spans"] = [list(s) for s in spans]
    return Trajectory(
        episode_id=leaf.episode_id,
        call_ids=[c.id for c in owned],
        strategy=STRATEGY,
        input_ids=input_ids,
        loss_mask=loss_mask,
        logprobs=logprobs,
        **fields,
        call_spans=spans,
        **per_call_columns(owned),
    )


def _span_trajectory(
    path: list[TokenCall], owned: list[TokenCall], episode: Episode | None
) -> SpanTrajectory:
    leaf = path[-1]
    spans = [(c.prompt_len, c.prompt_len + c.output_len) for c in owned]
    per_call = per_call_columns(owned)  # first: the calls' bodies rebuilt in order, the leaf's last
    fields = leaf_fields(leaf, episode)
    fields["metadata"]["call_output_spans"] = [list(s) for s in spans]
    return SpanTrajectory(
        episode_id=leaf.episode_id,
        call_ids=[c.id for c in owned],
        strategy=STRATEGY,
        input_ids=leaf.full_ids(),
        call_spans=spans,
        span_logprobs=[span_logprobs(c) for c in owned],
        **fields,
        **per_call,
    )


def leaf_paths[AnyCall: (Call, TokenCall)](
    calls: Sequence[AnyCall],
) -> Iterator[tuple[list[AnyCall], list[AnyCall]]]:
    """(path from its root, the calls of it this trajectory owns) for each leaf of one episode's forest."""
    if _one_chain(calls):  # an agent loop's episode: one path, its every call owned
        if calls:
            yield list(calls), list(calls)
        return
    by_id = {c.id: c for c in calls}
    full_lens = [_full_len(c) for c in calls]
    parent: dict[str, Any] = {}
    children: dict[str | None, list[AnyCall]] = {None: []}
    longest = 0  # the longest full sequence among the calls before call i
    for i, call in enumerate(calls):
        up = _find_parent(call, calls, i, by_id, full_lens, longest)
        longest = max(longest, full_lens[i])
        parent[call.id] = up
        children[up.id if up is not None else None].append(call)
        children[call.id] = []
    claimed: set[str] = set()
    # Depth-first over the forest, children in sequence order; each leaf yields its path.
    stack = list(reversed(children[None]))
    while stack:
        node = stack.pop()
        kids = children[node.id]
        if kids:
            stack.extend(reversed(kids))
            continue
        path: list[AnyCall] = []
        cur: AnyCall | None = node
        while cur is not None:
            path.append(cur)
            cur = parent[cur.id]
        path.reverse()
        owned = [c for c in path if c.id not in claimed]
        claimed.update(c.id for c in owned)
        yield path, owned


def _one_chain(calls: Sequence[Call] | Sequence[TokenCall]) -> bool:
    """Whether each call is stored as an extension of the one before it (the store's prompt reference, so
    without comparing tokens). Then the forest is that one path: each call's parent is the call before it,
    the longest of the earlier calls (full lengths only grow along such a chain; on a tie, find_parent takes
    the later call), so `leaf_paths` need not look for parents."""
    return all(_stored_as_extension(calls[i], calls[i - 1]) for i in range(1, len(calls)))


def merge_episode(
    calls: list[Call] | list[TokenCall], episode: Episode | None = None
) -> Iterator[Trajectory | SpanTrajectory]:
    """The trajectories of one episode's exported calls (given in sequence order); SpanTrajectory objects
    for TokenCalls."""
    for path, owned in leaf_paths(calls):
        if isinstance(path[-1], TokenCall):
            yield _span_trajectory(path, owned, episode)  # type: ignore[arg-type]
        else:
            yield _trajectory(path, owned, episode)  # type: ignore[arg-type]


def prefix_merge(
    calls: Iterable[Call] | Iterable[TokenCall],
    *,
    episodes: Mapping[str, Episode] | None = None,
    include_failed: bool = False,
) -> Iterator[Trajectory | SpanTrajectory]:
    """Merge each episode's calls into leaf-path trajectories. `calls` come grouped by episode and in
    sequence order within it (as `Store.iter_calls` yields them); one episode is held in memory at a time.
    `include_failed` and `episodes` mean what they mean for per-request; the reward is the leaf call's own
    when it has one, else its episode's. From `TokenCall`s (store/token_calls.py) it yields SpanTrajectory
    objects, equal in meaning, whose tokens stay arrays."""
    episodes = episodes or {}
    for episode_id, group in groupby(calls, key=lambda c: c.episode_id):
        selected = sorted((c for c in group if is_exported(c, include_failed)), key=lambda c: c.seq)
        yield from merge_episode(selected, episodes.get(episode_id))  # type: ignore[arg-type]
