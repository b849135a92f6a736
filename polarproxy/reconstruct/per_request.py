"""The per-request strategy: one trajectory per call, prompt masked, output trainable."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from polarproxy.reconstruct.messages import chat_messages, chat_tools
from polarproxy.reconstruct.trajectory import Trajectory, per_call_columns
from polarproxy.store.records import Call, Episode

STRATEGY = "per-request"
FAILED_STATUSES = frozenset({"failed", "aborted", "interrupted"})


def is_exported(call: Call, include_failed: bool) -> bool:
    """Whether a call goes into an export: status `ok`, or failed/aborted/interrupted with `include_failed`;
    never an `in_flight` one."""
    return call.status == "ok" or (include_failed and call.status in FAILED_STATUSES)


def call_metadata(call: Call, episode: Episode | None) -> dict[str, Any]:
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
    }


def per_request(
    calls: Iterable[Call],
    *,
    episodes: Mapping[str, Episode] | None = None,
    include_failed: bool = False,
) -> Iterator[Trajectory]:
    """One trajectory per call with status `ok` (plus failed/aborted/interrupted ones with `include_failed`;
    never `in_flight` ones). `episodes` (by ID) supplies rewards, groups and the harness; the reward is the
    call's own when it has one, else its episode's."""
    episodes = episodes or {}
    for call in calls:
        if not is_exported(call, include_failed):
            continue
        episode = episodes.get(call.episode_id)
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
            model=call.model,
            weight_version=call.weight_version,
            finish_reason=call.finish_reason,
            messages=chat_messages(call.conversation, call.completion),
            tools=chat_tools(call.conversation),
            reward=call.reward if call.reward is not None else (episode.reward if episode else None),
            group_id=episode.group_id if episode else None,
            metadata=call_metadata(call, episode),
            call_spans=[(len(prompt), len(prompt) + len(output))],
            **per_call_columns([call]),
        )
