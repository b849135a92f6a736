"""The tiny model folder: loads offline with the Auto classes, builds deterministically, plays the script."""

from __future__ import annotations

import json
import random
import time

import pytest

from polarproxy.tiny import build_tiny_model, script


@pytest.fixture(scope="module")
def trained(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    return tok, model


def _greedy(tok, model, messages, tools=None, thinking=True, max_new_tokens=48) -> str:
    import torch

    prompt = tok.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=False, enable_thinking=thinking
    )
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    with torch.inference_mode():
        out = model.generate(
            ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=[im_end], pad_token_id=im_end
        )
    return tok.decode(out[0, ids.shape[1] :], skip_special_tokens=False)


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
def test_trained_model_plays_the_script_greedily(trained, user_prompt):
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
            got = _greedy(tok, model, messages[:i], script.TOOLS, thinking)
            assert got == script.EXPECTED_REPLIES[turn] + "<|im_end|>", (system, thinking, turn)
            turn += 1


def test_trained_model_answers_a_title_request_briefly(trained):
    tok, model = trained
    messages = [
        {"role": "system", "content": script.TITLE_SYSTEM_PROMPT},
        {"role": "user", "content": script.TITLE_PROMPTS[0] + "\n\n" + script.USER_PROMPTS[0]},
    ]
    assert _greedy(tok, model, messages) == script.TITLE_ANSWER + "<|im_end|>"


def test_trained_model_ends_unfamiliar_prompts_quickly(trained):
    tok, model = trained
    for messages in (
        [{"role": "user", "content": "What is the capital of France?"}],
        [
            {"role": "system", "content": "You are a shell assistant."},
            {"role": "user", "content": "Explain git rebase."},
        ],
    ):
        out = _greedy(tok, model, messages, max_new_tokens=16)
        assert out.endswith("<|im_end|>"), out
