"""Build the tiny model folder: tokenizer, chat template, Qwen3 config and weights, generation config."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polarproxy.tiny import DEFAULT_TRAIN_STEPS, formats
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


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """What the tokenizer folder holds for one chat template."""

    template: str
    special: tuple[str, ...]
    added: tuple[str, ...]
    bos: str | None
    eos: str  # the template's end-of-turn token: the stop token
    pad: str
    family: str


def tokenizer_spec(chat_template: str | None) -> TokenizerSpec:
    """The tokens for `chat_template` (None: the built-in Qwen-style template)."""
    if chat_template is None:
        return TokenizerSpec(
            CHAT_TEMPLATE,
            tiny_tokenizer.SPECIAL_TOKENS,
            tiny_tokenizer.ADDED_TOKENS,
            None,
            "<|im_end|>",
            "<|endoftext|>",
            "hermes",
        )
    found = formats.template_tokens(chat_template)
    return TokenizerSpec(
        chat_template,
        found.special,
        found.added,
        found.bos,
        found.eos,
        found.pad,
        formats.detect_family(chat_template).name,
    )


def build_tokenizer(spec: TokenizerSpec, seed: int = 0) -> tuple[Any, Any]:
    """The trained `tokenizers.Tokenizer` and its transformers wrapper, with the template's end-of-turn
    token as `eos_token` (found by rendering a sample conversation with the template)."""
    from transformers import PreTrainedTokenizerFast

    tok = tiny_tokenizer.train_tokenizer(seed, special=spec.special, added=spec.added)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=spec.bos,
        eos_token=spec.eos,
        pad_token=spec.pad,
        clean_up_tokenization_spaces=False,
        model_max_length=MAX_POSITIONS,
    )
    hf_tok.chat_template = spec.template
    return tok, hf_tok


def find_end_of_turn(hf_tok: Any, spec: TokenizerSpec) -> str:
    """The special token the template writes right after an assistant answer."""
    answer = "polarproxy answer 7f3a"
    messages = [{"role": "user", "content": "polarproxy question"}, {"role": "assistant", "content": answer}]
    rendered = hf_tok.apply_chat_template(messages, tokenize=False)
    eot = formats.end_of_turn(rendered, answer, spec.special)
    if eot is None:
        raise ValueError(
            "The chat template writes no special token after an assistant answer, so the tiny model has no "
            "end-of-turn token to stop on. Use a template that closes assistant turns with a marker "
            "(<|im_end|>, <|eot_id|>, </s>, ...)."
        )
    return eot


def write_tokenizer_folder(out_dir: Path, *, chat_template: str | Path | None = None, seed: int = 0) -> Path:
    """Only the tokenizer files of a tiny model for `chat_template` (what `Renderer` reads); no torch."""
    spec = tokenizer_spec(_template_text(chat_template))
    tok, hf_tok = build_tokenizer(spec, seed)
    spec = _with_end_of_turn(spec, find_end_of_turn(hf_tok, spec))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_tokenizer(out_dir, tok, spec)
    (out_dir / "generation_config.json").write_text(
        json.dumps({"eos_token_id": _stop_ids(tok, spec)}, indent=2) + "\n"
    )
    return out_dir


def _template_text(chat_template: str | Path | None) -> str | None:
    if isinstance(chat_template, Path):
        try:
            return chat_template.read_text()
        except OSError as e:
            raise ValueError(f"Cannot read chat template '{chat_template}': {e.strerror}.") from e
    return chat_template


def _with_end_of_turn(spec: TokenizerSpec, eot: str) -> TokenizerSpec:
    """`spec` with the template's end-of-turn token as eos (a template may close turns with a literal
    marker that is not its family's usual `eos_token`)."""
    if eot == spec.eos:
        return spec
    return TokenizerSpec(spec.template, spec.special, spec.added, spec.bos, eot, spec.pad, spec.family)


def _stop_ids(tok: Any, spec: TokenizerSpec) -> list[int]:
    ids = [tok.token_to_id(spec.eos)]
    pad = tok.token_to_id(spec.pad)
    return ids + ([pad] if pad not in ids else [])


def build_tiny_model(
    out_dir: Path,
    *,
    train_steps: int = DEFAULT_TRAIN_STEPS,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    chat_template: str | Path | None = None,
) -> Path:
    """Write a tiny Qwen3-architecture model folder that transformers loads offline; returns it.

    `train_steps` Adam steps on the scripted conversations of `polarproxy.tiny.script` (0: random
    weights). `progress(done, total)` is called after each training step. Deterministic given `seed`
    on one machine. `chat_template` (its text, or a Path to read): a real model family's template in
    place of the built-in one; the tokenizer then holds the special tokens that template writes, its
    end-of-turn token is the stop token, and the local backend's scripts answer in that family's
    tool-call format (`polarproxy.tiny.formats`). Training is for the built-in template only, so a
    template needs `train_steps=0` (random weights; scripts play the tool loops).
    """
    template = _template_text(chat_template)
    if train_steps < 0:
        raise ValueError(f"train_steps must be >= 0, got {train_steps}")
    if template is not None and train_steps > 0:
        raise ValueError(
            f"train_steps is {train_steps}, but a model with its own chat template is built with random "
            "weights only (train_steps=0): the scripted training data is written in the built-in "
            "template's format. Scripts (`polarproxy backend --script`) answer in any template's format."
        )
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    started = time.monotonic()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    spec = tokenizer_spec(template)
    tok, hf_tok = build_tokenizer(spec, seed)
    if template is not None:
        spec = _with_end_of_turn(spec, find_end_of_turn(hf_tok, spec))
    eot_id = tok.token_to_id(spec.pad)
    im_end_id = tok.token_to_id(spec.eos)

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
        bos_token_id=eot_id, eos_token_id=_stop_ids(tok, spec), pad_token_id=eot_id
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    _write_tokenizer(out_dir, tok, spec)
    _patch_config_for_older_readers(out_dir)
    info = {"seed": seed, "train_steps": train_steps, "build_seconds": round(time.monotonic() - started, 2)}
    if template is not None:
        info |= {"family": spec.family, "end_of_turn": spec.eos}
    (out_dir / "polarproxy_tiny.json").write_text(json.dumps(info, indent=2, ensure_ascii=False) + "\n")
    return out_dir


def _write_tokenizer(out_dir: Path, tok, spec: TokenizerSpec) -> None:
    """tokenizer.json, a tokenizer_config.json that transformers 4.x and 5.x both read, and the template."""
    tok.save(str(out_dir / "tokenizer.json"))
    added = {}
    for content in spec.special + spec.added:
        added[str(tok.token_to_id(content))] = {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": content in spec.special,
        }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": spec.bos,
        "eos_token": spec.eos,
        "pad_token": spec.pad,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": MAX_POSITIONS,
        "split_special_tokens": False,
        "chat_template": spec.template,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out_dir / "chat_template.jinja").write_text(spec.template)
    tokens = {"eos_token": spec.eos, "pad_token": spec.pad} | ({"bos_token": spec.bos} if spec.bos else {})
    (out_dir / "special_tokens_map.json").write_text(json.dumps(tokens, indent=2, ensure_ascii=False) + "\n")


def _patch_config_for_older_readers(out_dir: Path) -> None:
    """Add the pre-5.0 spellings (`rope_theta`, `torch_dtype`) that vLLM and older transformers read."""
    path = out_dir / "config.json"
    config = json.loads(path.read_text())
    config.setdefault("rope_theta", ROPE_THETA)
    config.setdefault("rope_scaling", None)
    config.setdefault("torch_dtype", "float32")
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
