"""The `/generate` request of the local backend, read as SGLang 0.5 reads it, and its client errors."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from polarproxy.backends.local.model_runner import ModelRunner, SamplingParams, SamplingParamsError


class RequestError(ValueError):
    """A client error answered with 400 and SGLang's error shape."""


@dataclass
class GenerateRequest:
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    return_text_in_logprobs: bool
    stream: bool
    rid: str


def json_object(body: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object (empty: {}); RequestError otherwise."""
    try:
        obj = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as e:
        raise RequestError(f"Invalid JSON in request body: {e}") from None
    if not isinstance(obj, dict):
        raise RequestError(f"The request body must be a JSON object, got {type(obj).__name__}.")
    return obj


def parse_generate(body: bytes, runner: ModelRunner, max_new_tokens_limit: int | None) -> GenerateRequest:
    """A `/generate` body as SGLang reads it (one prompt, no batches); `max_new_tokens_limit` caps the
    request's `max_new_tokens`. RequestError saying what is wrong."""
    obj = json_object(body)
    text, input_ids = obj.get("text"), obj.get("input_ids")
    if (text is None) == (input_ids is None):
        raise RequestError("Either text or input_ids should be provided.")
    if text is not None:
        if not isinstance(text, str):
            raise RequestError("Batched requests are not supported by the local backend: give one text.")
        ids = runner.encode(text)
    else:
        if not isinstance(input_ids, list) or (input_ids and isinstance(input_ids[0], list)):
            raise RequestError(
                "input_ids must be a list of token IDs; batched requests are not supported by the local backend."
            )
        ids = input_ids
    try:
        params = SamplingParams.from_dict(obj.get("sampling_params"))
        runner.check_prompt(ids)
    except (SamplingParamsError, ValueError) as e:
        raise RequestError(str(e)) from None
    limit = max_new_tokens_limit
    if limit is not None and params.max_new_tokens > limit:
        params.max_new_tokens = limit
        params.min_new_tokens = min(params.min_new_tokens, limit)
    rid = obj.get("rid")
    return GenerateRequest(
        input_ids=list(ids),
        params=params,
        return_logprob=bool(obj.get("return_logprob") or False),
        return_text_in_logprobs=bool(obj.get("return_text_in_logprobs") or False),
        stream=bool(obj.get("stream") or False),
        rid=rid if isinstance(rid, str) and rid else uuid.uuid4().hex,
    )
