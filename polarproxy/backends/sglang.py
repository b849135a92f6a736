"""Client for SGLang's native `POST /generate` (SGLang 0.5; `polarproxy backend` speaks the same).

Requests carry `input_ids` so the backend consumes exactly the prompt we rendered, with
`return_logprob` and `skip_special_tokens: false`. Every chunk's `meta_info.weight_version` is read:
a generation carries the first chunk's and the latest one's, which differ when the weights were
updated while the call was sampled (a paused-in-place server swapped under it). Streamed chunks are cumulative by default (the full
output so far); a server started with incremental streaming sends only new tokens, and both are read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson

from polarproxy.backends.base import BackendError, GenerateParams, Generation
from polarproxy.backends.http11 import HTTPClient, HTTPError, Response
from polarproxy.backends.sglang_tail import MIN_EVENT_CHARS, cumulative_tail
from polarproxy.backends.wire import disconnected, error_message, get, post_json
from polarproxy.sse import SSEDecoder


def sampling_params(params: GenerateParams) -> dict[str, Any]:
    sp: dict[str, Any] = {"max_new_tokens": params.max_new_tokens, "skip_special_tokens": False}
    return params.set_options(sp, seed_key="sampling_seed")


def _finish(meta: dict[str, Any]) -> tuple[str | None, int | str | None]:
    """(finish reason, matched stop) from SGLang's finish-reason object; an abort raises BackendError."""
    fr = meta.get("finish_reason")
    if fr is None:
        return None, None
    if isinstance(fr, str):
        return fr, None
    kind = fr.get("type")
    if kind == "abort":
        raise abort_error(fr)
    return ("length" if kind == "length" else "stop"), fr.get("matched")


def abort_error(fr: dict[str, Any]) -> BackendError:
    """SGLang's `{"type": "abort", "message", "status_code", "err_type"}`: 400 means the request was bad."""
    message = str(fr.get("message") or "aborted by the backend")
    code = fr.get("status_code")
    if code == 400:
        return BackendError(f"Backend rejected the request: {message}", kind="backend_rejected", status=400)
    return BackendError(
        f"Backend aborted the request: {message}", kind="backend_aborted", status=503 if code == 503 else 502
    )


def _check_prefix(data: dict[str, Any], ids: list[int], lps: list[float]) -> None:
    """The last event, parsed whole, must begin with what the stream's events gave when read by their new
    elements only; a misread fails the call instead of being recorded."""
    out_ids = data.get("output_ids") or []
    meta = data.get("meta_info") or {}
    triples = meta.get("output_token_logprobs") or []
    if meta.get("completion_tokens") not in (None, len(out_ids)):
        return  # an incremental event: it holds only new tokens (a first one may have been read either way)
    n = len(ids)
    if out_ids[:n] != ids or [float(t[0]) for t in triples[: len(lps)]] != lps:
        raise BackendError(
            "The backend's last stream event disagrees with the events before it (output IDs or logprobs "
            "changed). polarproxy reads cumulative SGLang events by their new elements; report this with "
            "the SGLang version, or start SGLang with --incremental-streaming-output.",
        )


class SGLangBackend:
    kind = "sglang"

    def __init__(self, url: str, *, timeout: float = 600.0) -> None:
        self.url = url.rstrip("/")
        self._http = HTTPClient(self.url, read_timeout=timeout)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _get(self, path: str) -> tuple[int, bytes]:
        return await get(self._http, self.url, path)

    async def health(self) -> None:
        status, _ = await self._get("/health")
        if status != 200:
            raise BackendError(f"Backend {self.url}/health answered {status}.", status=503)

    async def model_info(self) -> dict[str, Any]:
        """`/model_info` (newer SGLang, our local backend), else `/get_model_info` (SGLang 0.5)."""
        for path in ("/model_info", "/get_model_info"):
            status, body = await self._get(path)
            if status == 200:
                return orjson.loads(body)
            if status != 404:
                break
        raise BackendError(f"Backend {self.url}{path} answered {status}.", status=503)

    async def generate(
        self, prompt_ids: Sequence[int], params: GenerateParams, *, stream: bool
    ) -> AsyncIterator[Generation]:
        payload = {
            "input_ids": prompt_ids,
            "sampling_params": sampling_params(params),
            "return_logprob": True,
            "stream": stream,
        }
        response = await post_json(self._http, self.url, "/generate", payload)
        first: str | None = None  # the weight version of the first chunk that reports one
        try:
            if stream:
                async for gen in self._read_stream(response):
                    first = first or gen.weight_version
                    gen.weight_version_first = first
                    yield gen
            else:
                gen = self._update(orjson.loads(await response.read()), [], [])
                gen.weight_version_first = gen.weight_version
                yield gen
        except HTTPError as e:
            raise disconnected(self.url, e) from e
        finally:
            await response.close()

    async def _read_stream(self, response: Response) -> AsyncIterator[Generation]:
        decoder = SSEDecoder()
        ids: list[int] = []
        lps: list[float] = []
        finished = False
        seen = False  # any answer chunk yet
        tailed = False  # an event was read by its new elements only (sglang_tail.py)
        async for chunk in response.iter_chunks():
            for ev in decoder.decode(chunk):
                if ev.data == "[DONE]":
                    if not finished:
                        raise BackendError(
                            "Backend ended the stream without a finish reason.", kind="backend_disconnected"
                        )
                    await response.finish()  # the connection goes back to the pool
                    return
                tail = cumulative_tail(ev.data, len(ids)) if len(ev.data) >= MIN_EVENT_CHARS else None
                if tail is not None and _finish(tail[0]["meta_info"])[0] is None:
                    seen, tailed = True, True
                    yield self._fold(tail[0]["meta_info"], tail[1], tail[2], ids, lps)
                    continue
                data = orjson.loads(ev.data)  # whole: a short event, or the last one (checked below)
                if "error" in data and "meta_info" not in data:
                    message = error_message(ev.data.encode())
                    if not seen:  # SGLang streams its request validation errors (a ValueError) this way
                        raise BackendError(
                            f"Backend {self.url}/generate rejected the request: {message}",
                            kind="backend_rejected",
                            status=400,
                        )
                    raise BackendError(f"Backend error mid-stream: {message}")
                seen = True
                if tailed:
                    _check_prefix(data, ids, lps)
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
        return SGLangBackend._fold(meta, new_ids, new_triples, ids, lps)

    @staticmethod
    def _fold(
        meta: dict[str, Any], new_ids: list[int], new_triples: list[Any], ids: list[int], lps: list[float]
    ) -> Generation:
        """Add one response's new IDs and their `[logprob, id, text]` triples to `ids`/`lps`."""
        ids.extend(new_ids)
        lps.extend(float(t[0]) for t in new_triples)
        finish, matched = _finish(meta)
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
