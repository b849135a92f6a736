"""What the capture layer needs from a backend: token IDs in, sampled token IDs and logprobs out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class GenerateParams:
    max_new_tokens: int
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None

    def set_options(self, into: dict[str, Any], *, seed_key: str = "seed") -> dict[str, Any]:
        """Add the sampling options a request set (and only those) to `into`, under the OpenAI/SGLang names
        they share; the seed goes under `seed_key` (SGLang's `/generate` calls it `sampling_seed`)."""
        for key in ("temperature", "top_p", "top_k"):
            value = getattr(self, key)
            if value is not None:
                into[key] = value
        if self.stop:
            into["stop"] = self.stop
        if self.stop_token_ids:
            into["stop_token_ids"] = self.stop_token_ids
        if self.seed is not None:
            into[seed_key] = self.seed
        return into


@dataclass(slots=True)
class Generation:
    """The backend's answer so far. Token lists grow; `finish_reason` is set on the last one."""

    output_ids: list[int]
    logprobs: list[float]
    new_ids: list[int]  # the IDs this update added
    finish_reason: str | None = None  # 'stop' | 'length' | 'abort'
    matched_stop: int | str | None = None
    prompt_tokens: int | None = None
    weight_version: str | None = None  # what the latest chunk reported
    weight_version_first: str | None = None  # what the first chunk that reported one said
    prompt_ids: list[int] | None = (
        None  # the prompt the server consumed, where it reports it (vLLM, chat mode)
    )


class BackendError(Exception):
    """The backend could not serve the call. `kind` says why, for the record and the harness."""

    def __init__(self, message: str, *, kind: str = "backend_error", status: int = 502) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind  # backend_unreachable | backend_error | backend_rejected | backend_disconnected | backend_aborted
        self.status = status


class Backend(Protocol):
    """A token-mode backend. A chat-mode one (`polarproxy.backends.chat.ChatBackend`) also has
    `mode = "chat"` and `generate_chat(conversation, params, stream=...)`, whose generations carry the
    `prompt_ids` the server rendered; the gateway then records them as server-rendered."""

    url: str
    kind: str  # sglang | local | vllm | vllm-chat | sglang-chat

    def generate(
        self, prompt_ids: Sequence[int], params: GenerateParams, *, stream: bool
    ) -> AsyncIterator[Generation]:
        """Yields growing generations; the last one has `finish_reason`. Raises BackendError."""
        ...

    async def health(self) -> None:
        """Raises BackendError when the backend cannot serve."""
        ...

    async def aclose(self) -> None: ...
