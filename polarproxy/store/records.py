"""Plain records that go into and come out of the store. No SQL here: the store maps them to tables."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from polarproxy.conversation import Conversation
from polarproxy.logprob_semantics import logprob_temperature

CallStatus = Literal["in_flight", "ok", "failed", "aborted", "interrupted"]
EpisodeStatus = Literal["running", "ok", "failed", "interrupted"]
RewardSource = Literal["command", "cli", "http"]
Fidelity = Literal["tokens", "server-rendered", "text"]
RenderMode = Literal["fresh", "extended", "server"]


@dataclass(slots=True)
class EpisodeStart:
    command: list[str]
    harness: str | None = None
    cwd: str | None = None
    task: str | None = None
    group_id: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class CallStart:
    """What is known when a call begins: the (redacted) request and the prompt the backend will consume."""

    episode_id: str
    dialect: str
    method: str
    path: str
    model: str
    stream: bool
    request_headers: dict[str, str]  # already redacted (T5)
    request_body: str  # the provider request body as text, already redacted (T5)
    # The parsed request (None when it did not parse): the Conversation itself, made plain data by the store
    # writer off the event loop (`conversation_dict`), or that plain data (Conversation.to_dict()).
    conversation: Conversation | dict[str, Any] | None
    prompt_ids: Sequence[int]  # the proxy's: an int32 array (render/prefix.py Prompt.tokens); or a list
    backend: str = ""
    backend_kind: str = ""
    fidelity: Fidelity = "tokens"
    render_mode: RenderMode = "fresh"
    extended_from: str | None = None  # call id whose prompt+output this prompt extends
    render_note: str | None = None  # why the call was rendered fresh where it could have extended
    started_at: float = 0.0
    # Linear-size storage: an earlier call of the episode whose token sequence (prompt + output) this
    # prompt starts with, and how many of its tokens (None: all of them). A hint only: the store verifies
    # the tokens, and also finds a shared prefix by itself when no hint is given.
    prompt_base_call_id: str | None = None
    prompt_base_len: int | None = None
    # The sampling temperature the backend is asked for (the logprobs depend on it). None: the store takes
    # the conversation's (`sampling.temperature`); None there too means the backend's default.
    temperature: float | None = None
    # The temperature the backend's logprobs are at (logprob_semantics.py); None: not known
    logprob_temperature: float | None = None
    # The top_p and top_k sent (top_k -1: off); None: not known (sent by no gateway)
    top_p: float | None = None
    top_k: int | None = None
    # What the gateway sent the backend and who chose each value (capture/sampling.py `sent_sampling`):
    # stored with the conversation as its `sent_sampling` member.
    sampling_sent: dict[str, Any] | None = None

    def conversation_dict(self) -> dict[str, Any] | None:
        """The conversation as plain data (Conversation.to_dict()), as the store keeps it, with what the
        gateway sent the backend (`sent_sampling`)."""
        c = self.conversation
        data = c.to_dict() if isinstance(c, Conversation) else c
        if data is not None and self.sampling_sent is not None:
            data = {**data, "sent_sampling": self.sampling_sent}
        return data


@dataclass(slots=True)
class CallResult:
    """How a call ended. `status` is 'ok' only when the harness was sent the complete answer."""

    status: CallStatus
    error: str | None = None
    http_status: int | None = None
    response_body: str | None = None  # the provider-shaped body sent to the harness (assembled for streams)
    completion: dict[str, Any] | None = None  # Completion.to_dict()
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    weight_version: str | None = None
    # The weight versions of the first and last answer chunks (None: not reported). They differ when the
    # weights were updated while the call was sampled: its tokens then come from two policies.
    weight_version_first: str | None = None
    weight_version_last: str | None = None
    latency_ms: float | None = None
    ttft_ms: float | None = None
    ended_at: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


@dataclass(slots=True)
class Episode:
    id: str
    command: list[str]
    harness: str | None
    cwd: str | None
    task: str | None
    group_id: str | None
    reward: float | None
    status: EpisodeStatus
    exit_code: int | None
    started_at: float
    ended_at: float | None
    metadata: dict[str, Any]
    calls: int | None = 0  # None: not counted (list_episodes(counts=False))
    tokens: int | None = 0  # prompt + output tokens over all calls; None: not counted
    stages: dict[str, float] | None = None  # seconds per rollout stage (prewarm, execute, evaluate)


@dataclass(slots=True)
class Call:
    """A stored call with its full token arrays rebuilt."""

    id: str
    episode_id: str
    seq: int
    dialect: str
    method: str
    path: str
    model: str
    stream: bool
    status: CallStatus
    error: str | None
    http_status: int | None
    request_headers: dict[str, str]
    request_body: str
    response_body: str | None
    conversation: dict[str, Any] | None
    completion: dict[str, Any] | None
    prompt_ids: list[int]
    output_ids: list[int]
    output_logprobs: list[float]
    finish_reason: str | None
    weight_version: str | None
    backend: str
    backend_kind: str
    fidelity: Fidelity
    render_mode: RenderMode
    extended_from: str | None
    render_note: str | None
    started_at: float
    ended_at: float | None
    latency_ms: float | None
    ttft_ms: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    reward: float | None = None
    # How the prompt is stored: `full_sequence(prompt_base_call_id)[:prompt_base_len]` + the tokens it adds
    # (None and 0 when stored whole). `prompt_ids` is always the whole prompt, rebuilt.
    prompt_base_call_id: str | None = None
    prompt_base_len: int = 0
    temperature: float | None = None  # None: the request set none (the backend's default applied)
    weight_version_first: str | None = None
    weight_version_last: str | None = None
    recorded_logprob_temperature: float | None = None  # m007; None: recorded before (see logprob_temperature)
    top_p: float | None = None  # m008: the top_p and top_k sent; None: recorded before, or not sent
    top_k: int | None = None

    @property
    def mixed_weight_versions(self) -> bool:
        """Whether the call's tokens came from more than one weight version (an update mid-call)."""
        versions = {self.weight_version_first, self.weight_version_last, self.weight_version} - {None}
        return len(versions) > 1

    @property
    def logprob_temperature(self) -> float | None:
        """The temperature the call's logprobs are at: as recorded (m007), or for a call recorded before,
        its backend kind's default semantics applied to its temperature (logprob_semantics.py)."""
        if self.recorded_logprob_temperature is not None:
            return self.recorded_logprob_temperature
        return logprob_temperature(self.backend_kind, self.temperature)

    @property
    def has_tools(self) -> bool:
        """Whether the request offered the model any tools. Side requests (titles, routers, commit
        messages) are ordinary calls of their episode that offer none."""
        return bool((self.conversation or {}).get("tools"))


@dataclass(slots=True)
class RewardOrigin:
    """Where a reward came from. `command` is the verifier's command line (already redacted), `exit_code`
    and `output_tail` what it did; `note` says anything else (a timeout, an unreadable output). A graded
    task adds the agent's changes as a diff (`patch`, bounded: rollout/agent_patch.py) and what the grader
    found (`grading`: `{"resolved", "parser", "tests": {test ID: status}}`, the grader's last line)."""

    source: RewardSource
    command: list[str] | None = None
    exit_code: int | None = None
    output_tail: str | None = None
    note: str | None = None
    patch: str | None = None
    grading: dict[str, Any] | None = None


@dataclass(slots=True)
class RewardRecord:
    """One reward as it was set: the value (None: cleared, or none could be read) and its origin.
    `call_seq` None is the episode's reward; else the call's (the number `polarproxy show` prints)."""

    episode_id: str
    call_seq: int | None
    call_id: str | None
    reward: float | None
    origin: RewardOrigin
    created_at: float
