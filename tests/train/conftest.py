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
                "schema_version": 3,
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
                "logprob_temperatures": [1.0],  # scored below by the model at T = 1
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


# The shape of the tiny models built from a config in the trainer's tests (random weights, no download).
TINY_SHAPE = dict(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=256,
)


def tiny_qwen3(**extra: Any) -> Any:
    """A tiny Qwen3 (attention only), float32, eval mode; `extra` overrides the config."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(**(TINY_SHAPE | extra))).to(torch.float32).eval()


def tiny_qwen3_5(**extra: Any) -> Any:
    """A tiny Qwen3.5 text model: one linear-attention (gated delta-net) layer, then one full-attention
    layer; logits far from uniform (initializer_range 0.2), so what a row sees shows in its logprobs."""
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    linear = dict(
        linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4
    )
    config = Qwen3_5TextConfig(
        **(TINY_SHAPE | linear | {"full_attention_interval": 2, "initializer_range": 0.2} | extra)
    )
    assert config.layer_types == ["linear_attention", "full_attention"]
    torch.manual_seed(0)
    return Qwen3_5ForCausalLM(config).to(torch.float32)


@pytest.fixture(scope="session")
def tiny_models():
    """(tiny_qwen3, tiny_qwen3_5): builders of the tiny models above."""
    return tiny_qwen3, tiny_qwen3_5


def logprobs_three_ways(model: Any, samples: list[Any]) -> tuple[Any, Any, Any]:
    """(packed, padded, behaviour) logprobs of the trainable tokens of `samples`, all rows in one
    micro-batch, under no_grad; behaviour is what the rows carry (each scored alone by `score`)."""
    from polarproxy.train.batching import packed_batch, padded_batch, step_weights
    from polarproxy.train.logprobs import batch_logprobs

    order = list(range(len(samples)))
    weights = step_weights(samples, "token-mean")
    with torch.no_grad():
        packed, _ = batch_logprobs(model, packed_batch(samples, order, weights))
        padded, _ = batch_logprobs(model, padded_batch(samples, order, weights, pad_id=0))
    return packed, padded, packed_batch(samples, order, weights).behaviour_logp


@pytest.fixture
def three_ways():
    """logprobs_three_ways(model, samples) -> (packed, padded, behaviour)."""
    return logprobs_three_ways


@pytest.fixture
def rows_of():
    """rows_of(model_dir, **options) -> export rows scored by that model (`make_rows`)."""
    return make_rows


@pytest.fixture(scope="session")
def scored_rows(random_model_dir: Path) -> list[dict[str, Any]]:
    return make_rows(random_model_dir)
