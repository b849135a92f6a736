"""Client for vLLM's OpenAI-compatible `POST /v1/completions` with token-ID prompts (vLLM 0.32).

The prompt goes out as token IDs (`"prompt": [ids]`) so vLLM consumes exactly what we rendered; with
`return_token_ids` vLLM reports the IDs it consumed (`choices[0].prompt_token_ids`) and sampled
(`choices[0].token_ids`, the stop token included), and `logprobs: 0` gives the sampled token's logprob
(`choices[0].logprobs.token_logprobs`). Streamed chunks are deltas (unlike SGLang's cumulative ones):
`prompt_token_ids` comes in the first chunk only, `token_ids` and `token_logprobs` hold the new tokens.
`finish_reason` is `stop` or `length` (`abort` and `error` end a request that failed); `stop_reason` is
the matched stop token ID or string, null for the model's EOS. Errors are
`{"error": {"message", "type", "param", "code"}}`, as a status or, mid-stream, as an event.

Protocol read from vLLM's `vllm/entrypoints/openai/completion/protocol.py` and `serving.py`.
vLLM reports no weight version; records from it carry none.
"""

from __future__ import annotations

from array import array
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson

from polarproxy.backends.base import BackendError, GenerateParams, Generation
from polarproxy.backends.http11 import HTTPClient, HTTPError, Response
from polarproxy.backends.wire import (
    check_health,
    disconnected,
    error_message,
    first_served_model,
    post_json,
)
from polarproxy.sse import SSEDecoder


def completion_request(
    model: str, prompt_ids: Sequence[int], params: GenerateParams, *, stream: bool
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt_ids,
        "max_tokens": params.max_new_tokens,
        "logprobs": 0,  # the sampled token's logprob, no alternatives
        "return_token_ids": True,
        "skip_special_tokens": False,
        "stream": stream,
    }
    return params.set_options(body)


class _Fold:
    """Accumulates choice deltas (streamed) or one whole choice into a growing Generation."""

    def __init__(self, url: str, prompt_ids: Sequence[int]) -> None:
        self.url = url
        self.sent_prompt = array("i", prompt_ids)
        self.ids: list[int] = []
        self.lps: list[float] = []
        self.prompt: list[int] | None = None

    def add(self, choice: dict[str, Any]) -> Generation:
        if choice.get("prompt_token_ids") is not None and self.prompt is None:
            self.prompt = list(choice["prompt_token_ids"])
            if array("i", self.prompt) != self.sent_prompt:
                raise BackendError(
                    f"Backend {self.url} consumed a different prompt than polarproxy sent "
                    f"({len(self.prompt)} vs {len(self.sent_prompt)} tokens); is a prompt template or "
                    "truncation configured on the server?",
                )
        new_ids = list(choice.get("token_ids") or [])
        logprobs = choice.get("logprobs") or {}
        new_lps = [lp for lp in (logprobs.get("token_logprobs") or [])]
        if len(new_ids) != len(new_lps):
            raise BackendError(
                f"Backend {self.url} returned {len(new_ids)} token IDs but {len(new_lps)} logprobs; "
                "the request asked for return_token_ids and logprobs, so it is not a vLLM-compatible server.",
            )
        if any(lp is None for lp in new_lps):
            raise BackendError(f"Backend {self.url} returned a null logprob for a sampled token.")
        self.ids.extend(new_ids)
        self.lps.extend(float(lp) for lp in new_lps)
        finish = choice.get("finish_reason")
        if finish in ("abort", "error"):
            raise BackendError(
                f"Backend {self.url} ended the request with finish_reason {finish!r}.",
                kind="backend_aborted" if finish == "abort" else "backend_error",
            )
        matched = choice.get("stop_reason")
        if finish == "stop" and matched is None and self.ids:
            matched = self.ids[-1]  # the model's EOS: vLLM reports no stop_reason for it
        return Generation(
            output_ids=self.ids,
            logprobs=self.lps,
            new_ids=new_ids,
            finish_reason=None if finish is None else ("length" if finish == "length" else "stop"),
            matched_stop=matched if finish is not None else None,
            prompt_tokens=len(self.prompt) if self.prompt is not None else None,
            prompt_ids=self.prompt,
        )


class VLLMBackend:
    kind = "vllm"

    def __init__(self, url: str, *, model: str | None = None, timeout: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self._http = HTTPClient(self.url, read_timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def health(self) -> None:
        await check_health(self._http, self.url)
        await self.served_model()

    async def served_model(self) -> str:
        """The model name vLLM serves (`/v1/models`), asked once."""
        if self.model is None:
            self.model = await first_served_model(self._http, self.url)
        return self.model

    async def generate(
        self, prompt_ids: Sequence[int], params: GenerateParams, *, stream: bool
    ) -> AsyncIterator[Generation]:
        payload = completion_request(await self.served_model(), prompt_ids, params, stream=stream)
        response = await post_json(self._http, self.url, "/v1/completions", payload)
        fold = _Fold(self.url, prompt_ids)
        try:
            if stream:
                async for gen in self._read_stream(response, fold):
                    yield gen
            else:
                body = orjson.loads(await response.read())
                yield fold.add(_only_choice(self.url, body))
        except HTTPError as e:
            raise disconnected(self.url, e) from e
        finally:
            await response.close()

    async def _read_stream(self, response: Response, fold: _Fold) -> AsyncIterator[Generation]:
        decoder = SSEDecoder()
        finished = False
        async for chunk in response.iter_chunks():
            for ev in decoder.decode(chunk):
                if ev.data == "[DONE]":
                    if not finished:
                        raise BackendError(
                            "Backend ended the stream without a finish reason.", kind="backend_disconnected"
                        )
                    await response.finish()  # the connection goes back to the pool
                    return
                data = orjson.loads(ev.data)
                if "error" in data:
                    raise BackendError(f"Backend error mid-stream: {error_message(ev.data.encode())}")
                if not data.get("choices"):  # the usage chunk
                    continue
                gen = fold.add(_only_choice(self.url, data))
                finished = finished or gen.finish_reason is not None
                yield gen
        if not finished:
            raise BackendError("Backend closed the stream before finishing.", kind="backend_disconnected")


def _only_choice(url: str, body: dict[str, Any]) -> dict[str, Any]:
    choices = body.get("choices") or []
    if len(choices) != 1:
        raise BackendError(f"Backend {url} answered {len(choices)} choices; polarproxy asked for one.")
    return choices[0]
