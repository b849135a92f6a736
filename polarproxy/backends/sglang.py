"""Client for SGLang's native `POST /generate` (SGLang 0.5; `polarproxy backend` speaks the same).

Requests carry `input_ids` so the backend consumes exactly the prompt we rendered, with
`return_logprob` and `skip_special_tokens: false`. Streamed chunks are cumulative by default (the full
output so far); a server started with incremental streaming sends only new tokens, and both are read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from polarproxy.backends.base import BackendError, GenerateParams, Generation
from polarproxy.backends.http11 import HTTPClient, HTTPError, Response
from polarproxy.sse import SSEDecoder


def sampling_params(params: GenerateParams) -> dict[str, Any]:
    sp: dict[str, Any] = {"max_new_tokens": params.max_new_tokens, "skip_special_tokens": False}
    if params.temperature is not None:
        sp["temperature"] = params.temperature
    if params.top_p is not None:
        sp["top_p"] = params.top_p
    if params.top_k is not None:
        sp["top_k"] = params.top_k
    if params.stop:
        sp["stop"] = params.stop
    if params.stop_token_ids:
        sp["stop_token_ids"] = params.stop_token_ids
    if params.seed is not None:
        sp["sampling_seed"] = params.seed
    return sp


def _error_message(body: bytes) -> str:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace")[:500]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            return str(err.get("message") or err)
        return str(err)
    return str(data)[:500]


def _finish(meta: dict[str, Any]) -> tuple[str | None, int | str | None, str | None]:
    fr = meta.get("finish_reason")
    if fr is None:
        return None, None, None
    if isinstance(fr, str):
        return fr, None, None
    kind = fr.get("type")
    if kind == "abort":
        return "abort", None, str(fr.get("message") or "aborted by the backend")
    return ("length" if kind == "length" else "stop"), fr.get("matched"), None


class SGLangBackend:
    kind = "sglang"

    def __init__(self, url: str, *, timeout: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self._http = HTTPClient(self.url, read_timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _get(self, path: str) -> tuple[int, bytes]:
        try:
            r = await self._http.request("GET", path)
            try:
                return r.status, await r.read()
            finally:
                await r.close()
        except HTTPError as e:
            kind = "backend_unreachable" if e.connect else "backend_error"
            raise BackendError(f"Backend {self.url} is unreachable: {e}", kind=kind, status=503) from e

    async def health(self) -> None:
        status, _ = await self._get("/health")
        if status != 200:
            raise BackendError(f"Backend {self.url}/health answered {status}.", status=503)

    async def model_info(self) -> dict[str, Any]:
        status, body = await self._get("/model_info")
        if status != 200:
            raise BackendError(f"Backend {self.url}/model_info answered {status}.", status=503)
        return orjson.loads(body)

    async def generate(
        self, prompt_ids: list[int], params: GenerateParams, *, stream: bool
    ) -> AsyncIterator[Generation]:
        payload = {
            "input_ids": prompt_ids,
            "sampling_params": sampling_params(params),
            "return_logprob": True,
            "stream": stream,
        }
        try:
            response = await self._http.request(
                "POST", "/generate", orjson.dumps(payload), {"content-type": "application/json"}
            )
        except HTTPError as e:
            if e.connect:
                raise BackendError(
                    f"Backend {self.url} is unreachable: {e}", kind="backend_unreachable", status=503
                ) from e
            raise BackendError(f"Backend {self.url} failed: {e}") from e
        try:
            if response.status != 200:
                body = await response.read()
                kind = "backend_rejected" if 400 <= response.status < 500 else "backend_error"
                raise BackendError(
                    f"Backend {self.url}/generate answered {response.status}: {_error_message(body)}",
                    kind=kind,
                    status=400 if kind == "backend_rejected" else 502,
                )
            if stream:
                async for gen in self._read_stream(response):
                    yield gen
            else:
                yield self._update(orjson.loads(await response.read()), [], [])
        except HTTPError as e:
            raise BackendError(
                f"Backend {self.url} dropped the connection mid-answer: {e}", kind="backend_disconnected"
            ) from e
        finally:
            await response.close()

    async def _read_stream(self, response: Response) -> AsyncIterator[Generation]:
        decoder = SSEDecoder()
        ids: list[int] = []
        lps: list[float] = []
        finished = False
        async for chunk in response.iter_chunks():
            for ev in decoder.decode(chunk):
                if ev.data == "[DONE]":
                    if not finished:
                        raise BackendError(
                            "Backend ended the stream without a finish reason.", kind="backend_disconnected"
                        )
                    return
                data = orjson.loads(ev.data)
                if "error" in data and "meta_info" not in data:
                    raise BackendError(f"Backend error mid-stream: {_error_message(ev.data.encode())}")
                gen = self._update(data, ids, lps)
                finished = gen.finish_reason is not None
                yield gen
        if not finished:
            raise BackendError("Backend closed the stream before finishing.", kind="backend_disconnected")

    @staticmethod
    def _update(data: dict[str, Any], ids: list[int], lps: list[float]) -> Generation:
        """Fold one response (cumulative or incremental) into `ids`/`lps`, which grow in place."""
        meta = data.get("meta_info") or {}
        out_ids = data.get("output_ids") or []
        triples = meta.get("output_token_logprobs") or []
        completion_tokens = meta.get("completion_tokens")
        if completion_tokens is None or completion_tokens == len(out_ids):  # cumulative
            new_ids = out_ids[len(ids) :]
            new_triples = triples[len(lps) :]
        else:  # incremental streaming output
            new_ids, new_triples = out_ids, triples
        ids.extend(new_ids)
        lps.extend(float(t[0]) for t in new_triples)
        finish, matched, abort_msg = _finish(meta)
        if abort_msg is not None:
            raise BackendError(f"Backend aborted the request: {abort_msg}", kind="backend_error")
        if len(lps) != len(ids):
            raise BackendError(
                f"Backend returned {len(ids)} output IDs but {len(lps)} logprobs; "
                "the request asked for return_logprob, so the backend is not SGLang-compatible.",
            )
        return Generation(
            output_ids=ids,
            logprobs=lps,
            new_ids=list(new_ids),
            finish_reason=finish,
            matched_stop=matched,
            prompt_tokens=meta.get("prompt_tokens"),
            weight_version=meta.get("weight_version"),
        )
