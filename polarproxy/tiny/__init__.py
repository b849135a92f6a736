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
) -> Path:
    """Write the tiny model folder to `out_dir` and return it (see `polarproxy.tiny.build`)."""
    from polarproxy.tiny.build import build_tiny_model as _build

    return _build(out_dir, train_steps=train_steps, seed=seed, progress=progress)


__all__ = ["DEFAULT_TRAIN_STEPS", "build_tiny_model"]
