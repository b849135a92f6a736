"""Export rows for the trainer's tests: random token sequences scored by the random-weights tiny model, so
that their behaviour logprobs are the model's own (ratio 1 before the first update)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")


def score(model_dir: Path, rows: list[dict[str, Any]]) -> None:
    """Fill each row's logprobs (where loss_mask is 1) with the model's logprob of the token."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row["input_ids"]])
            logits = model(input_ids=ids, use_cache=False).logits[0].float()
            lp = torch.log_softmax(logits, -1)
            row["logprobs"] = [
                float(lp[p - 1, row["input_ids"][p]]) if m and p > 0 else None
                for p, m in enumerate(row["loss_mask"])
            ]


def make_rows(
    model_dir: Path,
    *,
    groups: int = 2,
    per_group: int = 3,
    lengths: tuple[int, int] = (12, 40),
    seed: int = 0,
    weight_version: str | None = "0",
    advantages: bool = True,
) -> list[dict[str, Any]]:
    """groups x per_group per-request rows: a masked prompt, then a sampled output (loss_mask 1), with
    rewards in {0, 1} and GRPO advantages (reward - group mean)."""
    rng = random.Random(seed)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    rows = []
    for g in range(groups):
        rewards = [float(rng.random() < 0.5) for _ in range(per_group)]
        if len(set(rewards)) == 1:
            rewards[0] = 1.0 - rewards[0]
        mean = sum(rewards) / len(rewards)
        for i in range(per_group):
            n = rng.randint(*lengths)
            prompt = rng.randint(2, n - 2)
            row = {
                "schema_version": 1,
                "strategy": "per-request",
                "episode_id": f"ep_{g}_{i}",
                "call_ids": [f"call_{g}_{i}"],
                "input_ids": [rng.randrange(vocab) for _ in range(n)],
                "loss_mask": [0] * prompt + [1] * (n - prompt),
                "logprobs": [None] * n,
                "model": "tiny",
                "weight_version": weight_version,
                "finish_reason": "stop",
                "messages": [],
                "tools": [],
                "reward": rewards[i],
                "group_id": f"grp_{g}",
                "metadata": {"dialect": "openai-chat", "fidelity": "tokens", "render_mode": "fresh"},
            }
            if advantages:
                row["advantage"] = rewards[i] - mean
            rows.append(row)
    score(model_dir, rows)
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def jsonl():
    """jsonl(path, rows) -> path: the rows written as JSON lines."""
    return write_jsonl


@pytest.fixture
def rows_of():
    """rows_of(model_dir, **options) -> export rows scored by that model (`make_rows`)."""
    return make_rows


@pytest.fixture(scope="session")
def scored_rows(random_model_dir: Path) -> list[dict[str, Any]]:
    return make_rows(random_model_dir)
