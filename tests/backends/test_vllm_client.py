"""polarproxy's vLLM client (/v1/completions with token IDs) against a vLLM-0.32-shaped double."""

from __future__ import annotations

import pytest
from vllm_double import VLLMDouble, VLLMFault

from polarproxy.backends.base import BackendError, GenerateParams
from polarproxy.backends.vllm import VLLMBackend, completion_request

EOS = 9
SCRIPT = [21, 22, 23, EOS, 77]


@pytest.fixture
def double():
    with VLLMDouble(outputs=SCRIPT, eos_token_ids=frozenset({EOS})) as d:
        yield d


async def _collect(url: str, prompt: list[int], params: GenerateParams, *, stream: bool):
    backend = VLLMBackend(url)
    try:
        return [g async for g in backend.generate(prompt, params, stream=stream)]
    finally:
        await backend.aclose()


def test_request_carries_token_ids_and_asks_for_ids_and_logprobs():
    body = completion_request(
        "m",
        [1, 2],
        GenerateParams(max_new_tokens=8, temperature=0.5, stop_token_ids=[EOS], seed=4),
        stream=True,
    )
    assert body["prompt"] == [1, 2] and body["return_token_ids"] is True and body["logprobs"] == 0
    assert body["max_tokens"] == 8 and body["stop_token_ids"] == [EOS] and body["seed"] == 4
    assert body["skip_special_tokens"] is False and body["stream"] is True


@pytest.mark.parametrize("stream", [False, True])
async def test_eos_is_recorded_with_its_logprob(double, stream):
    gens = await _collect(
        double.url, [1, 2, 3], GenerateParams(max_new_tokens=16, stop_token_ids=[EOS]), stream=stream
    )
    last = gens[-1]
    assert last.output_ids == [21, 22, 23, EOS]
    assert last.logprobs == [double.logprob(i, t) for i, t in enumerate(last.output_ids)]
    assert last.finish_reason == "stop" and last.matched_stop == EOS  # vLLM says stop_reason null for EOS
    assert last.prompt_ids == [1, 2, 3] and last.prompt_tokens == 3
    sent = double.requests[-1]
    assert sent["model"] == double.model and sent["prompt"] == [1, 2, 3]
    if stream:  # deltas, one token each
        assert [g.new_ids for g in gens] == [[21], [22], [23], [EOS]]


async def test_stop_token_id_is_the_stop_reason(double):
    gens = await _collect(
        double.url, [1], GenerateParams(max_new_tokens=16, stop_token_ids=[22]), stream=True
    )
    assert gens[-1].output_ids == [21, 22] and gens[-1].matched_stop == 22


@pytest.mark.parametrize("stream", [False, True])
async def test_length(double, stream):
    gens = await _collect(double.url, [1], GenerateParams(max_new_tokens=2), stream=stream)
    assert gens[-1].output_ids == [21, 22] and gens[-1].finish_reason == "length"


@pytest.mark.parametrize("stream", [False, True])
async def test_validation_error_is_rejected_with_vllms_message(double, stream):
    with pytest.raises(BackendError) as e:
        await _collect(double.url, [1], GenerateParams(max_new_tokens=2, top_p=2.0), stream=stream)
    assert e.value.kind == "backend_rejected" and e.value.status == 400
    assert "top_p must be in (0, 1], got 2.0." in e.value.message


async def test_prompt_too_long(double):
    double.max_model_len = 4
    with pytest.raises(BackendError) as e:
        await _collect(double.url, [1] * 5, GenerateParams(max_new_tokens=2), stream=False)
    assert e.value.kind == "backend_rejected" and "maximum context length is 4 tokens" in e.value.message


async def test_error_event_mid_stream(double):
    double.fault = VLLMFault(error_after=2)
    with pytest.raises(BackendError) as e:
        await _collect(double.url, [1], GenerateParams(max_new_tokens=8), stream=True)
    assert e.value.kind == "backend_error" and "Internal server error" in e.value.message


@pytest.mark.parametrize(("reason", "kind"), [("abort", "backend_aborted"), ("error", "backend_error")])
async def test_abort_and_error_finish_reasons(double, reason, kind):
    double.fault = VLLMFault(finish_reason_after=(1, reason))
    with pytest.raises(BackendError) as e:
        await _collect(double.url, [1], GenerateParams(max_new_tokens=8), stream=True)
    assert e.value.kind == kind


async def test_dropped_connection(double):
    double.fault = VLLMFault(drop_after=2)
    with pytest.raises(BackendError) as e:
        await _collect(double.url, [1], GenerateParams(max_new_tokens=8), stream=True)
    assert e.value.kind == "backend_disconnected"


async def test_a_different_consumed_prompt_is_an_error(double, monkeypatch):
    """T1: the record must hold what the backend consumed; a server that altered the prompt is refused."""
    import polarproxy.backends.vllm as v

    real = v.completion_request
    monkeypatch.setattr(
        v,
        "completion_request",
        lambda m, p, params, stream: {**real(m, p, params, stream=stream), "prompt": [5, *p]},
    )
    with pytest.raises(BackendError) as e:
        await _collect(double.url, [1, 2], GenerateParams(max_new_tokens=2), stream=False)
    assert "consumed a different prompt" in e.value.message


async def test_health_asks_for_the_model(double):
    backend = VLLMBackend(double.url)
    try:
        await backend.health()
        assert backend.model == double.model
    finally:
        await backend.aclose()


async def test_unreachable():
    with pytest.raises(BackendError) as e:
        await _collect("http://127.0.0.1:1", [1], GenerateParams(max_new_tokens=2), stream=False)
    assert e.value.kind == "backend_unreachable"
