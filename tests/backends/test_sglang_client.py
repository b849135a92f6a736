"""polarproxy's SGLang client against a double that answers as SGLang 0.5 does (tests/backends/sglang_double.py)."""

from __future__ import annotations

from array import array

import pytest
from sglang_double import SAMPLING_KEYS, Fault, SGLangDouble

from polarproxy.backends.base import BackendError, GenerateParams
from polarproxy.backends.sglang import SGLangBackend, sampling_params

EOS = 7  # the double's end-of-turn token
SCRIPT = [11, 12, 13, EOS, 99]


@pytest.fixture
def double():
    with SGLangDouble(outputs=SCRIPT, eos_token_ids=frozenset({EOS}), special_ids=frozenset({EOS})) as d:
        yield d


async def _collect(url: str, prompt: list[int], params: GenerateParams, *, stream: bool):
    backend = SGLangBackend(url)
    try:
        return [g async for g in backend.generate(prompt, params, stream=stream)]
    finally:
        await backend.aclose()


def test_client_sends_only_sampling_keys_sglang_accepts():
    params = GenerateParams(
        max_new_tokens=5, temperature=0.7, top_p=0.9, top_k=20, stop=["x"], stop_token_ids=[EOS], seed=3
    )
    assert set(sampling_params(params)) <= SAMPLING_KEYS


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_token_is_recorded_with_its_logprob(double, stream):
    gens = await _collect(
        double.url, [1, 2, 3], GenerateParams(max_new_tokens=16, stop_token_ids=[EOS]), stream=stream
    )
    last = gens[-1]
    assert last.output_ids == [11, 12, 13, EOS]
    assert last.logprobs == [double.logprob(i, t) for i, t in enumerate([11, 12, 13, EOS])]
    assert last.finish_reason == "stop" and last.matched_stop == EOS
    assert last.prompt_tokens == 3
    sent = double.requests[-1]
    assert sent["input_ids"] == [1, 2, 3] and sent["return_logprob"] is True
    assert sent["sampling_params"]["skip_special_tokens"] is False
    if stream:  # one update per token, each adding exactly the new token
        assert [g.new_ids for g in gens] == [[11], [12], [13], [EOS]]
        assert all(g.finish_reason is None for g in gens[:-1])


async def test_an_int32_array_prompt_is_sent_as_the_json_list_of_its_ids(double):
    # The proxy's prompts are int32 arrays (render/prefix.py Prompt.tokens): the JSON the backend reads holds
    # the same integers a list would give.
    prompt = array("i", [0, 1, 2, 3, 998, 999])
    gens = await _collect(double.url, prompt, GenerateParams(max_new_tokens=2), stream=False)
    assert double.requests[-1]["input_ids"] == prompt.tolist()
    assert gens[-1].prompt_tokens == len(prompt)


@pytest.mark.parametrize("stream", [False, True])
async def test_length_finish(double, stream):
    gens = await _collect(
        double.url, [1], GenerateParams(max_new_tokens=2, stop_token_ids=[EOS]), stream=stream
    )
    assert gens[-1].output_ids == [11, 12] and gens[-1].finish_reason == "length"


async def test_weight_version_is_recorded(double):
    double.weight_version = "step-42"
    gens = await _collect(double.url, [1], GenerateParams(max_new_tokens=4), stream=True)
    assert {g.weight_version for g in gens} == {"step-42"}


async def test_incremental_streaming_output_is_read_as_deltas(double):
    double.incremental_streaming_output = True
    gens = await _collect(
        double.url, [1, 2], GenerateParams(max_new_tokens=16, stop_token_ids=[EOS]), stream=True
    )
    assert gens[-1].output_ids == [11, 12, 13, EOS]
    assert len(gens[-1].logprobs) == 4
    assert [g.new_ids for g in gens] == [[11], [12], [13], [EOS]]


async def test_string_stop_finishes_with_the_matched_string(double):
    gens = await _collect(double.url, [1], GenerateParams(max_new_tokens=16, stop=["<12>"]), stream=False)
    assert gens[-1].output_ids == [11, 12]
    assert gens[-1].finish_reason == "stop" and gens[-1].matched_stop == "<12>"


@pytest.mark.parametrize("stream", [False, True])
async def test_validation_error_is_backend_rejected(double, stream):
    with pytest.raises(BackendError) as e:
        await _collect(double.url, [1], GenerateParams(max_new_tokens=4, top_p=0.0), stream=stream)
    assert "top_p must be in (0, 1], got 0.0." in e.value.message
    # plain: a 400; streamed: SGLang answers 200 and an error chunk before any token
    assert e.value.kind == "backend_rejected" and e.value.status == 400


@pytest.mark.parametrize("stream", [False, True])
async def test_prompt_longer_than_context_names_the_lengths(double, stream):
    double.context_length = 8
    with pytest.raises(BackendError) as e:
        await _collect(double.url, list(range(10)), GenerateParams(max_new_tokens=4), stream=stream)
    assert "The input (10 tokens) is longer than the model's context length (8 tokens)." in e.value.message


async def test_pydantic_validation_error_shape_is_read():
    with SGLangDouble(outputs=SCRIPT) as d:
        backend = SGLangBackend(d.url)
        try:
            with pytest.raises(BackendError) as e:
                # a prompt of strings fails GenerateReqInput's validation (400 ErrorResponse)
                async for _ in backend.generate(["a"], GenerateParams(max_new_tokens=1), stream=False):  # type: ignore[list-item]
                    pass
        finally:
            await backend.aclose()
    assert e.value.kind == "backend_rejected" and "input_ids" in e.value.message


async def test_unknown_sampling_key_is_a_bare_500(double, monkeypatch):
    """SGLang raises TypeError for an unknown sampling_params key: a plain-text 500, not JSON."""
    import polarproxy.backends.sglang as sg

    real = sg.sampling_params
    monkeypatch.setattr(sg, "sampling_params", lambda p: {**real(p), "seed": 1})
    with pytest.raises(BackendError) as e:
        await _collect(double.url, [1], GenerateParams(max_new_tokens=2), stream=False)
    assert (
        e.value.kind == "backend_error"
        and "500" in e.value.message
        and "Internal Server Error" in e.value.message
    )


async def test_unknown_sampling_key_breaks_a_stream(double, monkeypatch):
    import polarproxy.backends.sglang as sg

    real = sg.sampling_params
    monkeypatch.setattr(sg, "sampling_params", lambda p: {**real(p), "seed": 1})
    with pytest.raises(BackendError) as e:
        await _collect(double.url, [1], GenerateParams(max_new_tokens=2), stream=True)
    assert e.value.kind == "backend_disconnected"


async def test_error_chunk_mid_stream(double):
    double.fault = Fault(error_after=2, error_message="Detokenizer failed: out of memory")
    with pytest.raises(BackendError) as e:
        await _collect(double.url, [1], GenerateParams(max_new_tokens=8), stream=True)
    assert "Detokenizer failed: out of memory" in e.value.message
    assert e.value.kind == "backend_error"  # after tokens went out it is the backend's failure


async def test_error_without_stream_is_400(double):
    double.fault = Fault(error_after=2, error_message="Detokenizer failed: out of memory")
    with pytest.raises(BackendError) as e:
        await _collect(double.url, [1], GenerateParams(max_new_tokens=8), stream=False)
    assert e.value.kind == "backend_rejected" and "Detokenizer failed" in e.value.message


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("status", "kind"), [(None, "backend_aborted"), (400, "backend_rejected"), (503, "backend_aborted")]
)
async def test_abort_is_a_backend_error(double, stream, status, kind):
    double.fault = Fault(abort_after=2, abort_status=status, abort_message="Abort in waiting queue")
    with pytest.raises(BackendError) as e:
        await _collect(double.url, [1], GenerateParams(max_new_tokens=8), stream=stream)
    assert "Abort in waiting queue" in e.value.message
    if status == 503 and not stream:  # SGLang answers an HTTPException: a plain 503 error body
        assert e.value.kind == "backend_error" and e.value.status == 503
    else:
        assert e.value.kind == kind


async def test_connection_dropped_mid_stream(double):
    double.fault = Fault(drop_after=2)
    with pytest.raises(BackendError) as e:
        await _collect(double.url, [1], GenerateParams(max_new_tokens=8), stream=True)
    assert e.value.kind == "backend_disconnected"


async def test_health_and_model_info(double):
    backend = SGLangBackend(double.url)
    try:
        await backend.health()
        info = await backend.model_info()
        assert info["model_path"] == double.model_path and info["weight_version"] == "default"
        double.fault = Fault(health_status=503)
        with pytest.raises(BackendError) as e:
            await backend.health()
        assert "503" in e.value.message and double.url in e.value.message
    finally:
        await backend.aclose()


async def test_max_new_tokens_zero_finishes_by_length(double):
    gens = await _collect(double.url, [1], GenerateParams(max_new_tokens=0), stream=False)
    assert gens[-1].output_ids == [] and gens[-1].finish_reason == "length"
