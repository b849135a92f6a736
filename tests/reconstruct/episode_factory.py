"""Record synthetic calls with chosen token IDs into a real Store, the way the capture layer does:
begin_call with the prompt, then finish_call with the sampled IDs (or leave the call in flight)."""

from __future__ import annotations

from polarproxy.store import CallResult, CallStart, Store

TOOLS = [{"name": "run", "description": "Run a command.", "parameters": {"type": "object", "properties": {}}}]


def logprobs_for(output: list[int]) -> list[float]:
    """Logprobs that float32 holds exactly, different per position."""
    return [-((t + i) % 64) / 16 - 0.0625 for i, t in enumerate(output)]


def record_call(
    store: Store,
    episode_id: str,
    prompt: list[int],
    output: list[int],
    *,
    status: str = "ok",
    finish_reason: str | None = "stop",
    with_logprobs: bool = True,
    extended_from: str | None = None,
    tools: bool = True,
    text: str = "",
) -> str:
    conv = {
        "messages": [{"role": "user", "content": f"prompt of {len(prompt)} tokens", "tool_calls": []}],
        "tools": TOOLS if tools else [],
        "sampling": {},
        "model": "tiny",
    }
    call_id, _ = store.begin_call(
        CallStart(
            episode_id=episode_id,
            dialect="openai_chat",
            method="POST",
            path="/v1/chat/completions",
            model="tiny",
            stream=True,
            request_headers={},
            request_body="{}",
            prompt_ids=prompt,
            backend_kind="sglang",
            conversation=conv,
            render_mode="extended" if extended_from else "fresh",
            extended_from=extended_from,
        )
    )
    if status != "in_flight":
        store.finish_call(
            call_id,
            CallResult(
                status=status,  # type: ignore[arg-type]
                error=None if status == "ok" else f"{status} in the test",
                output_ids=output,
                output_logprobs=logprobs_for(output) if with_logprobs else [],
                completion={"text": text or f"{len(output)} tokens", "reasoning": None, "tool_calls": []},
                finish_reason=finish_reason,
                weight_version="w1",
            ),
        )
    return call_id
