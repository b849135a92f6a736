"""Tiny Qwen3-architecture model kit, built offline: tokenizer, chat template, model, scripted training.

`build_tiny_model(out_dir)` writes a folder that `transformers.AutoTokenizer` and
`AutoModelForCausalLM` load offline. torch and transformers are imported only when it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

DEFAULT_TRAIN_STEPS = 200


def build_tiny_model(
    out_dir: Path,
    *,
    train_steps: int = DEFAULT_TRAIN_STEPS,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
    chat_template: str | Path | None = None,
) -> Path:
    """Write the tiny model folder to `out_dir` and return it (see `polarproxy.tiny.build`).
    `chat_template`: a real template's text (or a Path to it) in place of the built-in one; needs
    `train_steps=0`."""
    from polarproxy.tiny.build import build_tiny_model as _build

    return _build(out_dir, train_steps=train_steps, seed=seed, progress=progress, chat_template=chat_template)


def write_tokenizer_folder(out_dir: Path, *, chat_template: str | Path | None = None, seed: int = 0) -> Path:
    """Only the tokenizer files (tokenizer.json, config, template, generation_config.json) of a tiny
    model for `chat_template`: what the renderer reads. Seconds faster than a model; no torch."""
    from polarproxy.tiny.build import write_tokenizer_folder as _write

    return _write(out_dir, chat_template=chat_template, seed=seed)


__all__ = ["DEFAULT_TRAIN_STEPS", "build_tiny_model", "write_tokenizer_folder"]
