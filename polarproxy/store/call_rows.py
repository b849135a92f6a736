"""A call's row as a `Call`: its token arrays and bodies rebuilt from the calls they are stored against."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import orjson
from sqlalchemy import Row

from polarproxy.store.arrays import unpack_ids, unpack_logprobs
from polarproxy.store.rebuild import BodyRebuilder, LazyPromptCall, Rebuilder, body_row, token_row
from polarproxy.store.records import Call


def _loads(text: str | None) -> Any:
    return None if text is None else orjson.loads(text)


def call_from_row(row: Row[Any], rebuilder: Rebuilder, bodies: BodyRebuilder, *, lazy: bool = False) -> Call:
    """A `Call` from its row: token arrays and bodies rebuilt from their bases (`lazy`: the prompt IDs only
    when read)."""
    m = row._mapping
    request_body, conversation_json = bodies.bodies(body_row(row))
    conversation = _loads(conversation_json)
    temperature = m["temperature"]
    if temperature is None and conversation:  # recorded before m005: the request's own
        temperature = (conversation.get("sampling") or {}).get("temperature")
    tokens = token_row(row)
    if lazy:
        length = rebuilder.note(tokens)
        make: Callable[..., Call] = partial(LazyPromptCall.make, partial(rebuilder.prompt, tokens), length)
    else:
        make = partial(Call, prompt_ids=rebuilder.prompt(tokens))
    return make(
        id=m["id"],
        episode_id=m["episode_id"],
        seq=m["seq"],
        dialect=m["dialect"],
        method=m["method"],
        path=m["path"],
        model=m["model"],
        stream=bool(m["stream"]),
        status=m["status"],
        error=m["error"],
        http_status=m["http_status"],
        request_headers=orjson.loads(m["request_headers_json"]),
        request_body=request_body,
        response_body=m["response_body"],
        conversation=conversation,
        completion=_loads(m["completion_json"]),
        output_ids=unpack_ids(m["output_ids"]),
        output_logprobs=unpack_logprobs(m["output_logprobs"]),
        finish_reason=m["finish_reason"],
        weight_version=m["weight_version"],
        backend=m["backend"],
        backend_kind=m["backend_kind"],
        fidelity=m["fidelity"],
        render_mode=m["render_mode"],
        extended_from=m["extended_from"],
        render_note=m["render_note"],
        started_at=m["started_at"],
        ended_at=m["ended_at"],
        latency_ms=m["latency_ms"],
        ttft_ms=m["ttft_ms"],
        prompt_tokens=m["prompt_tokens"],
        completion_tokens=m["completion_tokens"],
        reward=m["reward"],
        prompt_base_call_id=m["prompt_base_call_id"],
        prompt_base_len=m["prompt_base_len"],
        temperature=temperature,
        weight_version_first=m["weight_version_first"],
        weight_version_last=m["weight_version_last"],
        recorded_logprob_temperature=m["logprob_temperature"],
        top_p=m["top_p"],
        top_k=m["top_k"],
    )
