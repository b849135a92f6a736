"""The per-request strategy: one trajectory per call, prompt masked, output trainable."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from polarproxy.reconstruct.messages import chat_messages, chat_tools
from polarproxy.reconstruct.trajectory import SpanTrajectory, Trajectory, per_call_columns, span_logprobs
from polarproxy.store.records import Call, Episode
from polarproxy.store.token_calls import TokenCall

STRATEGY = "per-request"
FAILED_STATUSES = frozenset({"failed", "aborted", "interrupted"})


def is_exported(call: Call | TokenCall, include_failed: bool) -> bool:
    """Whether a call goes into an export: status `ok`, or failed/aborted/interrupted with `include_failed`;
    never an `in_flight` one."""
    return call.status == "ok" or (include_failed and call.status in FAILED_STATUSES)


def call_metadata(call: Call | TokenCall, episode: Episode | None) -> dict[str, Any]:
    """What a row says about where its tokens came from."""
    return {
        "dialect": call.dialect,
        "harness": episode.harness if episode else None,
        "task": episode.task if episode else None,
        "fidelity": call.fidelity,
        "render_mode": call.render_mode,
        "backend": call.backend,
        "backend_kind": call.backend_kind,
        "call_status": call.status,
        "has_tools": call.has_tools,
        # the task's and the rollout's (rollout_id, task_id, sample), as the episode was created with them
        "episode_metadata": dict(episode.metadata) if episode else {},
    }


def leaf_fields(leaf: Call | TokenCall, episode: Episode | None) -> dict[str, Any]:
    """The trajectory fields that come from its last call (and its episode): model, messages, reward, ..."""
    conversation = leaf.conversation
    return {
        "model": leaf.model,
        "weight_version": leaf.weight_version,
        "finish_reason": leaf.finish_reason,
        "messages": chat_messages(conversation, leaf.completion),
        "tools": chat_tools(conversation),
        "reward": leaf.reward if leaf.reward is not None else (episode.reward if episode else None),
        "group_id": episode.group_id if episode else None,
        "metadata": call_metadata(leaf, episode),
    }


def _span_trajectory(call: TokenCall, episode: Episode | None) -> SpanTrajectory:
    p = call.prompt_len
    return SpanTrajectory(
        episode_id=call.episode_id,
        call_ids=[call.id],
        strategy=STRATEGY,
        input_ids=call.full_ids(),
        call_spans=[(p, p + call.output_len)],
        span_logprobs=[span_logprobs(call)],
        **leaf_fields(call, episode),
        **per_call_columns([call]),
    )


def per_request(
    calls: Iterable[Call] | Iterable[TokenCall],
    *,
    episodes: Mapping[str, Episode] | None = None,
    include_failed: bool = False,
) -> Iterator[Trajectory | SpanTrajectory]:
    """One trajectory per call with status `ok` (plus failed/aborted/interrupted ones with `include_failed`;
    never `in_flight` ones). `episodes` (by ID) supplies rewards, groups and the harness; the reward is the
    call's own when it has one, else its episode's. From `TokenCall`s (store/token_calls.py) it yields
    SpanTrajectory objects, equal in meaning, whose tokens stay arrays."""
    episodes = episodes or {}
    for call in calls:
        if not is_exported(call, include_failed):
            continue
        episode = episodes.get(call.episode_id)
        if isinstance(call, TokenCall):
            yield _span_trajectory(call, episode)
            continue
        prompt, output = call.prompt_ids, call.output_ids
        output_logprobs: list[float | None] = (
            list(call.output_logprobs) if call.output_logprobs else [None] * len(output)
        )
        yield Trajectory(
            episode_id=call.episode_id,
            call_ids=[call.id],
            strategy=STRATEGY,
            input_ids=prompt + output,
            loss_mask=[0] * len(prompt) + [1] * len(output),
            logprobs=[None] * len(prompt) + output_logprobs,
            **leaf_fields(call, episode),
            call_spans=[(len(prompt), len(prompt) + len(output))],
            **per_call_columns([call]),
        )
