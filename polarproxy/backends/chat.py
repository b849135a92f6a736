"""Chat mode: `POST /v1/chat/completions` to a server that applies the chat template itself.

For servers polarproxy cannot (or should not) send token IDs to. The request carries the conversation's
messages and tools plus the token-ID options: vLLM's `return_token_ids` with `logprobs` (the sampled
token's logprob), and for SGLang `return_meta_info` too. The answer must report the prompt the server
rendered (`prompt_token_ids`) and the sampled IDs (`choices[0].token_ids`, or SGLang's
`meta_info.output_token_logprobs` triples); streamed chunks are deltas, the prompt comes in the first.

What polarproxy records from this mode is marked `fidelity="server-rendered"`, `render_mode="server"`:
the prompt IDs are the server's, not a prefix-preserving render, so T2 does not hold (an earlier answer is
re-tokenized from its text by the server's template on the next turn). The tools are sent with
`tool_choice: "none"` so the server renders them into the prompt without parsing tool calls itself:
polarproxy parses the sampled tokens as in token mode.
"""

from __future__ import annotations

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
from polarproxy.conversation import Conversation
from polarproxy.render.renderer import template_message, template_tool
from polarproxy.sse import SSEDecoder


def chat_request(
    model: str, conv: Conversation, params: GenerateParams, *, stream: bool, flavor: str
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [template_message(m) for m in conv.messages],
        "max_tokens": params.max_new_tokens,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "stream": stream,
    }
    if flavor == "sglang":
        body["return_meta_info"] = True
    if conv.tools:
        body["tools"] = [template_tool(t) for t in conv.tools]
        body["tool_choice"] = "none"  # rendered into the prompt; polarproxy parses the sampled tokens
    return params.set_options(body)


def _meta(body: dict[str, Any], choice: dict[str, Any]) -> dict[str, Any]:
    meta = choice.get("meta_info") or body.get("meta_info") or {}
    return meta if isinstance(meta, dict) else {}


class _Fold:
    def __init__(self, url: str) -> None:
        self.url = url
        self.ids: list[int] = []
        self.lps: list[float] = []
        self.prompt: list[int] | None = None

    def add(self, body: dict[str, Any], choice: dict[str, Any]) -> Generation:
        meta = _meta(body, choice)
        prompt = (
            body.get("prompt_token_ids") or choice.get("prompt_token_ids") or meta.get("prompt_token_ids")
        )
        if prompt is not None and self.prompt is None:
            self.prompt = [int(t) for t in prompt]
        if choice.get("token_ids") is not None:
            new_ids = [int(t) for t in choice["token_ids"]]
            content = (choice.get("logprobs") or {}).get("content") or []
            new_lps = [c.get("logprob") for c in content]
        else:  # SGLang's meta_info triples (cumulative, as in /generate)
            triples = meta.get("output_token_logprobs") or []
            new_ids = [int(t[1]) for t in triples[len(self.ids) :]]
            new_lps = [t[0] for t in triples[len(self.ids) :]]
        if len(new_ids) != len(new_lps) or any(lp is None for lp in new_lps):
            raise BackendError(
                f"Backend {self.url} returned {len(new_ids)} token IDs but {len(new_lps)} logprobs; chat mode "
                "needs a server that reports token IDs (vLLM's return_token_ids, SGLang's return_meta_info).",
            )
        self.ids.extend(new_ids)
        self.lps.extend(float(lp) for lp in new_lps)
        finish = choice.get("finish_reason")
        if finish in ("abort", "error"):
            raise BackendError(
                f"Backend {self.url} ended the request with finish_reason {finish!r}.",
                kind="backend_aborted" if finish == "abort" else "backend_error",
            )
        if finish is not None and self.prompt is None:
            raise BackendError(
                f"Backend {self.url} did not report the prompt token IDs it rendered; chat mode records them. "
                "Use a server with return_token_ids (vLLM >= 0.10) or --backend-mode tokens.",
            )
        matched = choice.get("stop_reason")
        if isinstance(meta.get("finish_reason"), dict):
            matched = meta["finish_reason"].get("matched", matched)
        if finish is not None and finish != "length" and matched is None and self.ids:
            matched = self.ids[-1]
        return Generation(
            output_ids=self.ids,
            logprobs=self.lps,
            new_ids=new_ids,
            finish_reason=None if finish is None else ("length" if finish == "length" else "stop"),
            matched_stop=matched if finish is not None else None,
            prompt_tokens=len(self.prompt) if self.prompt is not None else None,
            weight_version=meta.get("weight_version"),
            prompt_ids=self.prompt,
        )


class ChatBackend:
    """A chat-mode client; `flavor` is the server kind ('vllm' or 'sglang')."""

    mode = "chat"

    def __init__(
        self, url: str, *, flavor: str = "vllm", model: str | None = None, timeout: float = 600.0
    ) -> None:
        self.url = url.rstrip("/")
        self.flavor = flavor
        self.kind = f"{flavor}-chat"
        self.model = model
        self._http = HTTPClient(self.url, read_timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def health(self) -> None:
        await check_health(self._http, self.url)
        await self.served_model()

    async def served_model(self) -> str:
        if self.model is None:
            self.model = await first_served_model(self._http, self.url)
        return self.model

    def generate(
        self, prompt_ids: Sequence[int], params: GenerateParams, *, stream: bool
    ) -> AsyncIterator[Generation]:
        raise BackendError("A chat-mode backend is given conversations, not token IDs (generate_chat).")

    async def generate_chat(
        self, conv: Conversation, params: GenerateParams, *, stream: bool
    ) -> AsyncIterator[Generation]:
        payload = chat_request(await self.served_model(), conv, params, stream=stream, flavor=self.flavor)
        response = await post_json(self._http, self.url, "/v1/chat/completions", payload)
        fold = _Fold(self.url)
        try:
            if stream:
                async for gen in self._read_stream(response, fold):
                    yield gen
            else:
                body = orjson.loads(await response.read())
                yield fold.add(body, _only_choice(self.url, body))
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
                gen = fold.add(data, _only_choice(self.url, data))
                finished = finished or gen.finish_reason is not None
                yield gen
        if not finished:
            raise BackendError("Backend closed the stream before finishing.", kind="backend_disconnected")


def _only_choice(url: str, body: dict[str, Any]) -> dict[str, Any]:
    choices = body.get("choices") or []
    if len(choices) != 1:
        raise BackendError(f"Backend {url} answered {len(choices)} choices; polarproxy asked for one.")
    return choices[0]
