"""The tiny model folder: loads offline with the Auto classes, builds deterministically, plays the script."""

from __future__ import annotations

import json
import math
import random
import time

import pytest

from polarproxy.tiny import build_tiny_model, script
from polarproxy.tiny.train import SHORT_ANSWER


@pytest.fixture(scope="module")
def trained(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    return tok, model


@pytest.fixture(scope="module")
def random_trained(random_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoTokenizer.from_pretrained(random_model_dir), AutoModelForCausalLM.from_pretrained(
        random_model_dir
    ).eval()


# Learned behaviour is checked with room to spare, never by one CPU's greedy output: the trained weights
# themselves differ from CPU to CPU (training is not bit-reproducible across instruction sets: on one CPU a
# title request gets "Reading the README", on another "OK."). Models trained from seeds 0-3 stand in for
# other CPUs (a harsher change than a CPU's rounding); the figures below were measured on them.
#
# A scripted reply whose every token leads the runner-up by MARGIN nats under teacher forcing is what greedy
# decoding produces, whatever the rounding (measured leads >= 0.7 nats; a random model's are negative).
MARGIN = 0.25
# The short replies the model is trained to give to side requests (titles) and unfamiliar prompts. Their
# joint probability, each as a whole reply with its end of turn, after a title request: measured 0.36-0.93;
# a random model gives < 1e-12. Which of them wins differs between trainings, so that is not tested.
SHORT_REPLIES = (script.TITLE_ANSWER, SHORT_ANSWER, script.FINAL_ANSWER)
SHORT_MASS = 0.15
# Unfamiliar prompts: the share of sampled replies (temperature 1) that end within 16 tokens (measured 1.0).
ENDED_SHARE = 0.8


def _render(tok, messages, tools=None, thinking=True) -> list[int]:
    prompt = tok.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False, enable_thinking=thinking
    )
    return tok(prompt, add_special_tokens=False)["input_ids"]


def _teacher_forced(tok, model, prompt: list[int], reply: str) -> tuple[list[float], list[float]]:
    """For each token of `reply` + end of turn after `prompt`: its logprob, and its lead over the best
    other token (positive everywhere iff greedy decoding produces exactly this reply)."""
    import torch

    ids = tok(reply + script.END_OF_TURN, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    lp = logits.log_softmax(-1)
    chosen = lp[torch.arange(len(ids)), torch.tensor(ids)]
    others = lp.clone()
    others[torch.arange(len(ids)), torch.tensor(ids)] = float("-inf")
    return chosen.tolist(), (chosen - others.max(-1).values).tolist()


def _probability(tok, model, prompt: list[int], reply: str) -> float:
    return math.exp(sum(_teacher_forced(tok, model, prompt, reply)[0]))


def test_folder_loads_offline_with_auto_classes(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (128, 384, 2)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (2, 1, 64)
    assert config.max_position_embeddings == 65536
    assert config.tie_word_embeddings is True
    assert config.vocab_size == len(tok) == 4096
    assert next(model.parameters()).dtype.is_floating_point
    im_end, eot = tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert GenerationConfig.from_pretrained(tiny_model_dir).eos_token_id == [im_end, eot]
    assert (tiny_model_dir / "model.safetensors").is_file()
    raw = json.loads((tiny_model_dir / "config.json").read_text())
    assert raw["rope_theta"] == 1_000_000.0 and raw["torch_dtype"] == "float32"


def test_random_weights_build_in_seconds_and_deterministically(tmp_path):
    started = time.monotonic()
    a = build_tiny_model(tmp_path / "a", train_steps=0, seed=5)
    elapsed = time.monotonic() - started
    b = build_tiny_model(tmp_path / "b", train_steps=0, seed=5)
    c = build_tiny_model(tmp_path / "c", train_steps=0, seed=6)
    assert elapsed < 20
    for name in (
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "config.json",
        "chat_template.jinja",
    ):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


def test_training_is_deterministic_given_the_seed(tmp_path):
    progress = []
    a = build_tiny_model(
        tmp_path / "a", train_steps=2, seed=1, progress=lambda done, total: progress.append((done, total))
    )
    b = build_tiny_model(tmp_path / "b", train_steps=2, seed=1)
    assert progress == [(1, 2), (2, 2)]
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


@pytest.mark.parametrize("user_prompt", script.USER_PROMPTS)
def test_trained_model_plays_the_script_greedily_with_a_margin(trained, user_prompt):
    tok, model = trained
    rng = random.Random(script.USER_PROMPTS.index(user_prompt))
    for system, thinking in ((script.SYSTEM_PROMPT, True), (None, True), (script.SYSTEM_PROMPT, False)):
        messages = script.scripted_conversation(
            user_prompt, script.random_workspace(rng), system_prompt=system
        )
        if not thinking:
            messages = [dict(m, reasoning_content="") if m["role"] == "assistant" else m for m in messages]
        turn = 0
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            prompt = _render(tok, messages[:i], script.TOOLS, thinking)
            _, leads = _teacher_forced(tok, model, prompt, script.EXPECTED_REPLIES[turn])
            assert min(leads) > MARGIN, (system, thinking, turn, [round(x, 2) for x in leads])
            turn += 1


def test_a_random_model_has_no_margin_on_the_script(random_trained):
    tok, model = random_trained
    messages = [
        {"role": "system", "content": script.SYSTEM_PROMPT},
        {"role": "user", "content": script.USER_PROMPTS[0]},
    ]
    _, leads = _teacher_forced(tok, model, _render(tok, messages, script.TOOLS), script.EXPECTED_REPLIES[0])
    assert min(leads) < 0


@pytest.mark.parametrize("title_prompt", script.TITLE_PROMPTS)
def test_trained_model_answers_a_title_request_with_a_short_learned_reply(
    trained, random_trained, title_prompt
):
    messages = [
        {"role": "system", "content": script.TITLE_SYSTEM_PROMPT},
        {"role": "user", "content": title_prompt + "\n\n" + script.USER_PROMPTS[0]},
    ]
    mass = {}
    for name, (tok, model) in (("trained", trained), ("random", random_trained)):
        prompt = _render(tok, messages)
        mass[name] = sum(_probability(tok, model, prompt, reply) for reply in SHORT_REPLIES)
    assert mass["trained"] > SHORT_MASS and mass["random"] < 1e-6, mass


def _ended_share(tok, model, messages, max_new_tokens: int = 16, samples: int = 64) -> float:
    """The share of `samples` replies sampled at temperature 1 that end their turn within `max_new_tokens`."""
    import torch

    ids = torch.tensor([_render(tok, messages)])
    im_end = tok.convert_tokens_to_ids(script.END_OF_TURN)
    torch.manual_seed(0)
    with torch.inference_mode():
        out = model.generate(
            ids,
            max_new_tokens=max_new_tokens,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            num_return_sequences=samples,
            eos_token_id=[im_end],
            pad_token_id=im_end,
        )
    return (out[:, ids.shape[1] :] == im_end).any(-1).float().mean().item()


UNFAMILIAR = (
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a shell assistant."},
        {"role": "user", "content": "Explain git rebase."},
    ],
)


@pytest.mark.parametrize("messages", UNFAMILIAR, ids=["user", "system-and-user"])
def test_trained_model_ends_unfamiliar_prompts_quickly(trained, random_trained, messages):
    trained_share = _ended_share(*trained, messages)
    random_share = _ended_share(*random_trained, messages)
    assert trained_share >= ENDED_SHARE and random_share < ENDED_SHARE, (trained_share, random_share)
