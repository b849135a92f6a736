"""ModelRunner: chunked prefill, KV-cached sampling with SGLang's rules, real logprobs."""

from __future__ import annotations

import pytest

from polarproxy.backends.local.model_runner import ModelRunner, SamplingParams, SamplingParamsError
from polarproxy.tiny import script


@pytest.fixture(scope="module")
def runner(tiny_model_dir) -> ModelRunner:
    return ModelRunner(tiny_model_dir)


@pytest.fixture(scope="module")
def random_runner(random_model_dir) -> ModelRunner:
    return ModelRunner(random_model_dir)


def _prompt(runner: ModelRunner) -> list[int]:
    messages = [
        {"role": "system", "content": script.SYSTEM_PROMPT},
        {"role": "user", "content": script.USER_PROMPTS[0]},
    ]
    text = runner.tokenizer.apply_chat_template(
        messages, tools=script.TOOLS, add_generation_prompt=True, tokenize=False
    )
    return runner.encode(text)


def _run(runner, ids, **params):
    return list(runner.generate(ids, SamplingParams.from_dict(params)))


def test_greedy_generation_plays_the_first_scripted_turn(runner):
    steps = _run(runner, _prompt(runner), temperature=0, max_new_tokens=64)
    im_end = runner.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert runner.decode([s.token_id for s in steps], skip_special_tokens=False) == (
        script.EXPECTED_REPLIES[0] + "<|im_end|>"
    )
    assert steps[-1].token_id == im_end
    assert steps[-1].finish_reason == {"type": "stop", "matched": im_end}
    assert all(s.finish_reason is None for s in steps[:-1])


def test_eos_ids_come_from_the_generation_config(runner):
    assert runner.eos_token_ids == sorted(
        runner.tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    )


def test_sampled_logprobs_equal_a_teacher_forced_score(random_runner):
    ids = random_runner.encode("The quick brown fox jumps over the lazy dog.")
    steps = _run(random_runner, ids, temperature=1.0, max_new_tokens=24, sampling_seed=11, ignore_eos=True)
    assert len(steps) == 24
    scored = random_runner.score(ids, [s.token_id for s in steps])
    assert max(abs(a - s.logprob) for a, s in zip(scored, steps, strict=True)) < 1e-4
    assert all(s.logprob <= 0 for s in steps)


def test_logprobs_are_at_the_sampling_temperature_as_sglang_returns_them(random_runner):
    """SGLang's default: the logprob of the sampled token under softmax(logits / T), before top-k/top-p;
    a greedy request's at T = 1."""
    ids = random_runner.encode("Sampling with a low temperature")
    steps = _run(
        random_runner,
        ids,
        temperature=0.3,
        top_k=5,
        top_p=0.9,
        max_new_tokens=12,
        sampling_seed=2,
        ignore_eos=True,
    )
    tokens = [s.token_id for s in steps]
    scaled = random_runner.score(ids, tokens, temperature=0.3)
    raw = random_runner.score(ids, tokens)
    assert max(abs(a - s.logprob) for a, s in zip(scaled, steps, strict=True)) < 1e-4
    assert max(abs(a - s.logprob) for a, s in zip(raw, steps, strict=True)) > 1e-2  # not the raw ones
    greedy = _run(random_runner, ids, temperature=0, max_new_tokens=6, ignore_eos=True)
    at_one = random_runner.score(ids, [s.token_id for s in greedy])
    assert max(abs(a - s.logprob) for a, s in zip(at_one, greedy, strict=True)) < 1e-4


def test_chunked_prefill_matches_a_single_chunk(random_runner):
    ids = random_runner.encode("chunked prefill " * 40)
    assert len(ids) > 60
    whole = _run(random_runner, ids, temperature=0, max_new_tokens=8, ignore_eos=True)
    random_runner.prefill_chunk = 7
    try:
        chunked = _run(random_runner, ids, temperature=0, max_new_tokens=8, ignore_eos=True)
        chunked_score = random_runner.score(ids, [s.token_id for s in whole])
    finally:
        random_runner.prefill_chunk = 1024
    assert [s.token_id for s in chunked] == [s.token_id for s in whole]
    assert max(abs(a.logprob - b.logprob) for a, b in zip(chunked, whole, strict=True)) < 1e-4
    assert max(abs(a - b.logprob) for a, b in zip(chunked_score, whole, strict=True)) < 1e-4


def test_sampling_seed_makes_sampling_reproducible(random_runner):
    ids = random_runner.encode("seeded")
    a = _run(random_runner, ids, max_new_tokens=20, sampling_seed=123, ignore_eos=True)
    b = _run(random_runner, ids, max_new_tokens=20, sampling_seed=123, ignore_eos=True)
    c = _run(random_runner, ids, max_new_tokens=20, sampling_seed=124, ignore_eos=True)
    assert [s.token_id for s in a] == [s.token_id for s in b]
    assert [s.token_id for s in a] != [s.token_id for s in c]


def test_top_k_one_is_greedy(random_runner):
    ids = random_runner.encode("top k")
    greedy = _run(random_runner, ids, temperature=0, max_new_tokens=10, ignore_eos=True)
    top1 = _run(random_runner, ids, temperature=1.0, top_k=1, max_new_tokens=10, ignore_eos=True)
    assert [s.token_id for s in greedy] == [s.token_id for s in top1]


def test_length_finish_reason_at_max_new_tokens(random_runner):
    steps = _run(random_runner, random_runner.encode("x"), max_new_tokens=5, ignore_eos=True, sampling_seed=0)
    assert len(steps) == 5
    assert steps[-1].finish_reason == {"type": "length", "length": 5}
    assert _run(random_runner, random_runner.encode("x"), max_new_tokens=0) == []


def test_stop_token_ids_and_min_new_tokens(runner):
    ids = _prompt(runner)
    greedy = _run(runner, ids, temperature=0, max_new_tokens=64)
    second = greedy[1].token_id
    stopped = _run(runner, ids, temperature=0, max_new_tokens=64, stop_token_ids=[second])
    assert [s.token_id for s in stopped] == [s.token_id for s in greedy[:2]]
    assert stopped[-1].finish_reason == {"type": "stop", "matched": second}
    # min_new_tokens masks the stop tokens until it is reached: the eos cannot end the turn early.
    long = _run(runner, ids, temperature=0, max_new_tokens=len(greedy) + 3, min_new_tokens=len(greedy) + 2)
    assert len(long) >= len(greedy) + 2
    assert greedy[-1].token_id not in [s.token_id for s in long[: len(greedy) + 1]]


def test_stop_string_finishes_generation(runner):
    steps = _run(runner, _prompt(runner), temperature=0, max_new_tokens=64, stop=["list_files"])
    assert steps[-1].finish_reason == {"type": "stop", "matched": "list_files"}
    assert runner.decode([s.token_id for s in steps]).endswith("list_files")


def test_should_stop_ends_generation_without_a_finish_reason(random_runner):
    calls = []

    def should_stop():
        calls.append(1)
        return len(calls) > 4

    steps = list(
        random_runner.generate(
            random_runner.encode("abc"), SamplingParams(max_new_tokens=100, ignore_eos=True), should_stop
        )
    )
    assert 0 < len(steps) < 5
    assert all(s.finish_reason is None for s in steps)
    assert not random_runner.busy


def test_prompts_at_or_over_the_context_length_are_rejected(random_runner):
    with pytest.raises(ValueError, match=r"longer than the model's context length \(65536 tokens\)"):
        random_runner.generate([1] * 65536, SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        random_runner.generate([], SamplingParams())
    with pytest.raises(ValueError, match="not a token ID"):
        random_runner.generate([1, 999_999], SamplingParams())


def test_score_edge_cases(random_runner):
    assert random_runner.score([1, 2], []) == []
    with pytest.raises(ValueError):
        random_runner.score([], [1])


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"frequency_penalty": 0.5}, "unexpected keyword argument 'frequency_penalty'"),
        ({"temperature": -1}, "temperature must be non-negative"),
        ({"top_p": 0}, "top_p must be in"),
        ({"top_k": 0}, "top_k must be -1"),
        ({"max_new_tokens": -1}, "max_new_tokens must be at least 0"),
        ({"max_new_tokens": "8"}, "max_new_tokens must be an integer"),
        ({"stop": [""]}, "stop must be"),
        ({"stop_token_ids": ["a"]}, "stop_token_ids must be"),
        ({"n": 2}, "n must be 1"),
        ({"min_new_tokens": 9, "max_new_tokens": 8}, "min_new_tokens must be in"),
    ],
)
def test_sampling_params_reject_unknown_keys_and_bad_values(params, message):
    with pytest.raises(SamplingParamsError, match=message):
        SamplingParams.from_dict(params)


def test_sampling_params_defaults_are_sglangs():
    p = SamplingParams.from_dict({"stop": "x", "stop_token_ids": None, "sampling_seed": None})
    assert (p.max_new_tokens, p.temperature, p.top_p, p.top_k, p.skip_special_tokens) == (
        128,
        1.0,
        1.0,
        -1,
        True,
    )
    assert p.stop == ["x"] and p.stop_token_ids == [] and p.sampling_seed is None
