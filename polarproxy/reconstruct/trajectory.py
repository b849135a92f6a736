"""A trajectory: one training sequence built from one or more calls, and the T4 round-trip check."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from polarproxy.store.records import Call
from polarproxy.store.token_calls import TokenCall


@dataclass(slots=True)
class Trajectory:
    """One token sequence for the trainer.

    `input_ids`, `loss_mask` and `logprobs` have one entry per token: mask 1 marks a token the model sampled
    (trainable, with its sampling logprob), mask 0 a token it was shown (logprob None).
    `messages` are OpenAI-style chat messages (role, content, reasoning_content, tool_calls, tool_call_id, name)
    ending with the assistant's reply; `tools` OpenAI-style function tools.
    `call_spans` holds, for each call in `call_ids`, the [start, end) positions of its sampled tokens;
    `end` is also the length of that call's own prompt + output (what a per-request row would hold).
    Aligned with `call_ids` too: each call's own reward (None: the episode's applies), weight version,
    sampling temperature (None: the backend's default) and whether its tokens came from more than one
    weight version. `advantage` is set by an export with advantages (export/advantages.py).
    """

    episode_id: str
    call_ids: list[str]
    strategy: str
    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float | None]
    model: str
    weight_version: str | None
    finish_reason: str | None
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    reward: float | None = None
    group_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    call_spans: list[tuple[int, int]] = field(default_factory=list)
    call_rewards: list[float | None] = field(default_factory=list)
    weight_versions: list[str | None] = field(default_factory=list)
    temperatures: list[float | None] = field(default_factory=list)
    logprob_temperatures: list[float | None] = field(default_factory=list)
    top_ps: list[float | None] = field(default_factory=list)
    top_ks: list[int | None] = field(default_factory=list)
    mixed_weight_versions: list[bool] = field(default_factory=list)
    advantage: float | None = None

    @property
    def trainable_tokens(self) -> int:
        return sum(self.loss_mask)


def per_call_columns(calls: Sequence[Call] | Sequence[TokenCall]) -> dict[str, Any]:
    """The Trajectory fields aligned with `call_ids`, for these calls (in order)."""
    return {
        "call_rewards": [c.reward for c in calls],
        "weight_versions": [c.weight_version for c in calls],
        "temperatures": [c.temperature for c in calls],
        "logprob_temperatures": [c.logprob_temperature for c in calls],
        "top_ps": [c.top_p for c in calls],
        "top_ks": [c.top_k for c in calls],
        "mixed_weight_versions": [c.mixed_weight_versions for c in calls],
    }


def assert_round_trip(traj: Trajectory, calls: Sequence[Call]) -> None:
    """Check T4 for `traj` built from `calls` (in order); raise AssertionError saying what differs.

    Holds for every strategy: each call's prompt is a prefix of `input_ids`, its sampled IDs follow it with
    mask 1 and its logprobs (None when the call recorded none), the trainable positions are exactly those
    output spans, and every other position has mask 0 and logprob None. The sequence ends with the last
    call's output.
    """

    def fail(message: str) -> None:
        raise AssertionError(
            f"T4 violated in trajectory of {traj.call_ids} (episode {traj.episode_id}): {message}"
        )

    ids, mask, lps = traj.input_ids, traj.loss_mask, traj.logprobs
    if not len(ids) == len(mask) == len(lps):
        fail(f"lengths differ: input_ids {len(ids)}, loss_mask {len(mask)}, logprobs {len(lps)}")
    if traj.call_ids != [c.id for c in calls]:
        fail(f"call_ids {traj.call_ids} are not the calls given {[c.id for c in calls]}")
    if any(m not in (0, 1) for m in mask):
        fail("loss_mask holds values other than 0 and 1")
    trainable: set[int] = set()
    end = 0
    for call in calls:
        p, o = len(call.prompt_ids), len(call.output_ids)
        if ids[:p] != call.prompt_ids:
            fail(f"call {call.id}'s prompt ({p} tokens) is not a prefix of input_ids")
        if ids[p : p + o] != call.output_ids:
            fail(f"call {call.id}'s output ids are not at positions {p}..{p + o}")
        if any(m != 1 for m in mask[p : p + o]):
            fail(f"call {call.id}'s output tokens are not all trainable")
        expected = call.output_logprobs if call.output_logprobs else [None] * o
        if lps[p : p + o] != expected:
            fail(f"call {call.id}'s logprobs differ from the recorded ones")
        if p < end:
            fail(f"call {call.id} starts at {p}, before the previous call's output ends at {end}")
        trainable.update(range(p, p + o))
        end = p + o
    if end != len(ids):
        fail(f"the sequence has {len(ids)} tokens but the last call's output ends at {end}")
    for i, (m, lp) in enumerate(zip(mask, lps, strict=True)):
        if i not in trainable and (m != 0 or lp is not None):
            fail(f"position {i} lies outside every call's output but has mask {m}, logprob {lp}")


@dataclass(slots=True)
class SpanTrajectory:
    """A Trajectory whose tokens stay arrays: what the strategies build from `TokenCall`s (store/token_calls.py)
    for the export writers, equal in meaning to the `Trajectory` of `to_trajectory()`.

    `input_ids` is an int32 array; the loss mask and the logprobs are given by the call output spans:
    mask 1 and the call's logprobs inside `call_spans[i]` (`span_logprobs[i]`, float32, None when the call
    recorded none), mask 0 and logprob None everywhere else. The other fields are Trajectory's."""

    episode_id: str
    call_ids: list[str]
    strategy: str
    input_ids: np.ndarray
    call_spans: list[tuple[int, int]]
    span_logprobs: list[np.ndarray | None]
    model: str
    weight_version: str | None
    finish_reason: str | None
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    reward: float | None = None
    group_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    call_rewards: list[float | None] = field(default_factory=list)
    weight_versions: list[str | None] = field(default_factory=list)
    temperatures: list[float | None] = field(default_factory=list)
    logprob_temperatures: list[float | None] = field(default_factory=list)
    top_ps: list[float | None] = field(default_factory=list)
    top_ks: list[int | None] = field(default_factory=list)
    mixed_weight_versions: list[bool] = field(default_factory=list)
    advantage: float | None = None

    @property
    def trainable_tokens(self) -> int:
        return sum(b - a for a, b in self.call_spans)

    def loss_mask_array(self) -> np.ndarray:
        mask = np.zeros(len(self.input_ids), dtype=np.int8)
        for a, b in self.call_spans:
            mask[a:b] = 1
        return mask

    def logprobs_filled(self, fill: float, dtype: Any) -> np.ndarray:
        """One logprob per position as a `dtype` array: each call's inside its span, `fill` where there is
        none (outside the spans, and in the span of a call that recorded none)."""
        values = np.full(len(self.input_ids), fill, dtype=dtype)
        for (a, b), lps in zip(self.call_spans, self.span_logprobs, strict=True):
            if lps is not None:
                values[a:b] = lps
        return values

    def logprob_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(values, valid): float32 logprobs (0.0 where there is none) and where there is one."""
        valid = np.zeros(len(self.input_ids), dtype=np.bool_)
        for (a, b), lps in zip(self.call_spans, self.span_logprobs, strict=True):
            if lps is not None:
                valid[a:b] = True
        return self.logprobs_filled(0.0, np.float32), valid

    def to_trajectory(self) -> Trajectory:
        """The same trajectory with list fields (what trajectory_to_row and assert_round_trip read)."""
        n = len(self.input_ids)
        logprobs: list[float | None] = [None] * n
        for (a, b), lps in zip(self.call_spans, self.span_logprobs, strict=True):
            if lps is not None:
                logprobs[a:b] = lps.tolist()
        return Trajectory(
            episode_id=self.episode_id,
            call_ids=self.call_ids,
            strategy=self.strategy,
            input_ids=self.input_ids.tolist(),
            loss_mask=self.loss_mask_array().tolist(),
            logprobs=logprobs,
            model=self.model,
            weight_version=self.weight_version,
            finish_reason=self.finish_reason,
            messages=self.messages,
            tools=self.tools,
            reward=self.reward,
            group_id=self.group_id,
            metadata=self.metadata,
            call_spans=self.call_spans,
            call_rewards=self.call_rewards,
            weight_versions=self.weight_versions,
            temperatures=self.temperatures,
            logprob_temperatures=self.logprob_temperatures,
            top_ps=self.top_ps,
            top_ks=self.top_ks,
            mixed_weight_versions=self.mixed_weight_versions,
            advantage=self.advantage,
        )


def span_logprobs(call: TokenCall) -> np.ndarray | None:
    """A TokenCall's output logprobs for SpanTrajectory.span_logprobs (None: none recorded)."""
    lps = call.output_logprobs
    return lps if len(lps) else None
