"""Build the tiny model folder: tokenizer, chat template, Qwen3 config and weights, generation config."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path

from polarproxy.tiny import DEFAULT_TRAIN_STEPS
from polarproxy.tiny import tokenizer as tiny_tokenizer
from polarproxy.tiny.template import CHAT_TEMPLATE

HIDDEN_SIZE = 128
INTERMEDIATE_SIZE = 384
NUM_LAYERS = 2
NUM_HEADS = 2
NUM_KV_HEADS = 1
HEAD_DIM = 64
MAX_POSITIONS = 65536
ROPE_THETA = 1_000_000.0


def build_tiny_model(
    out_dir: Path,
    *,
    train_steps: int = DEFAULT_TRAIN_STEPS,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """Write a tiny Qwen3-architecture model folder that transformers loads offline; returns it.

    `train_steps` Adam steps on the scripted conversations of `polarproxy.tiny.script` (0: random
    weights). `progress(done, total)` is called after each training step. Deterministic given `seed`
    on one machine.
    """
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    if train_steps < 0:
        raise ValueError(f"train_steps must be >= 0, got {train_steps}")
    started = time.monotonic()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    tok = tiny_tokenizer.train_tokenizer(seed)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=MAX_POSITIONS,
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    eot_id = tok.token_to_id("<|endoftext|>")
    im_end_id = tok.token_to_id("<|im_end|>")

    config = Qwen3Config(
        vocab_size=tok.get_vocab_size(),
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        bos_token_id=eot_id,
        eos_token_id=im_end_id,
        pad_token_id=eot_id,
        dtype="float32",
    )
    config.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(seed)
    random.seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)

    if train_steps > 0:
        from polarproxy.tiny.train import train

        def render(messages, **kwargs):
            return hf_tok.apply_chat_template(messages, tokenize=False, **kwargs)

        def encode(text: str) -> list[int]:
            return tok.encode(text, add_special_tokens=False).ids

        train(model, render, encode, steps=train_steps, seed=seed, pad_id=eot_id, progress=progress)

    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=eot_id, eos_token_id=[im_end_id, eot_id], pad_token_id=eot_id
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    _write_tokenizer(out_dir, tok)
    _patch_config_for_older_readers(out_dir)
    (out_dir / "polarproxy_tiny.json").write_text(
        json.dumps(
            {"seed": seed, "train_steps": train_steps, "build_seconds": round(time.monotonic() - started, 2)},
            indent=2,
        )
        + "\n"
    )
    return out_dir


def _write_tokenizer(out_dir: Path, tok) -> None:
    """tokenizer.json, a tokenizer_config.json that transformers 4.x and 5.x both read, and the template."""
    tok.save(str(out_dir / "tokenizer.json"))
    added = {}
    for content in tiny_tokenizer.SPECIAL_TOKENS + tiny_tokenizer.ADDED_TOKENS:
        added[str(tok.token_to_id(content))] = {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": content in tiny_tokenizer.SPECIAL_TOKENS,
        }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": MAX_POSITIONS,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, indent=2) + "\n"
    )


def _patch_config_for_older_readers(out_dir: Path) -> None:
    """Add the pre-5.0 spellings (`rope_theta`, `torch_dtype`) that vLLM and older transformers read."""
    path = out_dir / "config.json"
    config = json.loads(path.read_text())
    config.setdefault("rope_theta", ROPE_THETA)
    config.setdefault("rope_scaling", None)
    config.setdefault("torch_dtype", "float32")
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
