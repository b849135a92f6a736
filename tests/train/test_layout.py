"""Micro-batch layout per model: packed rows where they are exact, padded where a layer carries state along
the row (Qwen3.5's linear attention), so the trained logprobs are always those of each row alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from polarproxy.train import TrainConfig, train  # noqa: E402
from polarproxy.train.batching import micro_batches, packed_batch, padded_batch, step_weights  # noqa: E402
from polarproxy.train.checkpoint import META  # noqa: E402
from polarproxy.train.data import samples_from_rows  # noqa: E402
from polarproxy.train.layout import choose_layout, packing_is_exact  # noqa: E402
from polarproxy.train.logprobs import batch_logprobs, hidden_states  # noqa: E402
from polarproxy.train.metrics import read_metrics  # noqa: E402


def _qwen3_5(vocab: int = 97):
    """A tiny Qwen3.5 text model: one linear-attention (gated delta-net) layer, one full-attention layer."""
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    config = Qwen3_5TextConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        full_attention_interval=2,
        max_position_embeddings=256,
        initializer_range=0.2,  # far from uniform logits, so what a row sees shows in its logprobs
    )
    assert config.layer_types == ["linear_attention", "full_attention"]
    torch.manual_seed(0)
    return Qwen3_5ForCausalLM(config).to(torch.float32)


@pytest.fixture(scope="module")
def qwen3_5_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("qwen3_5")
    _qwen3_5(vocab=512).save_pretrained(d)
    return d


def test_packing_carries_linear_attention_state_across_sequences(qwen3_5_dir: Path, rows_of) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(qwen3_5_dir), dtype=torch.float32).eval()
    rows = rows_of(qwen3_5_dir, groups=1, per_group=3)
    samples = samples_from_rows(rows)
    order = list(range(len(samples)))
    weights = step_weights(samples, "token-mean")
    with torch.no_grad():
        packed, _ = batch_logprobs(model, packed_batch(samples, order, weights))
        padded, _ = batch_logprobs(model, padded_batch(samples, order, weights, pad_id=0))
    own = packed_batch(samples, order, weights).behaviour_logp  # each row scored alone
    # why the layout exists: packed, the later rows start from the earlier rows' state
    assert (packed - own).abs().max() > 1e-3
    assert torch.allclose(padded, own, atol=1e-4)
    model.train()
    assert not packing_is_exact(model)
    assert model.training  # the probe gives the model back in the mode it found it


def test_attention_only_models_pack(random_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(random_model_dir), dtype=torch.float32)
    assert packing_is_exact(model)
    assert choose_layout(model, None) == "packed"
    assert choose_layout(model, _qwen3_5()) == "padded"  # a reference model that cannot pack


def test_padded_micro_batches_are_length_sorted_within_budget_and_cover_every_token(scored_rows) -> None:
    samples = samples_from_rows(scored_rows)
    step = list(range(len(samples)))
    mbs = micro_batches(samples, step, "token-mean", token_budget=80, layout="padded")
    assert len(mbs) > 1
    assert sorted(i for mb in mbs for i in mb.samples) == step
    assert sum(int(mb.targets.numel()) for mb in mbs) == sum(s.trainable_tokens for s in samples)
    assert sum(float(mb.weights.sum()) for mb in mbs) == pytest.approx(1.0)
    widths = []
    for mb in mbs:
        assert mb.tokens <= 80 or len(mb.samples) == 1  # padding counts against the budget
        assert mb.attention_mask is not None
        widths.append(mb.input_ids.shape[1])
    assert widths == sorted(widths)
    with pytest.raises(
        ValueError, match=r"Unknown micro-batch layout 'ragged'\. Must be one of 'packed', 'padded'"
    ):
        micro_batches(samples, step, "token-mean", 80, layout="ragged")


def test_training_a_linear_attention_model_sees_each_row_alone(
    tmp_path: Path, qwen3_5_dir: Path, rows_of
) -> None:
    rows = rows_of(qwen3_5_dir)  # behaviour logprobs: the model's own, each row alone
    out = tmp_path / "run"
    cfg = TrainConfig(steps=1, lr=1e-3, token_budget=96, logprob_chunk=16, device="cpu")
    result = train(rows, qwen3_5_dir, out, cfg)
    (m,) = read_metrics(out)
    # before the update the policy is the behaviour policy: every ratio is 1, as it is only when no row
    # sees another's state (packed, ratio_max was far from 1)
    assert m["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert m["ratio_max"] == pytest.approx(1.0, abs=1e-3)
    assert m["micro_batches"] > 1
    assert json.loads((result.checkpoint / META).read_text())["micro_batch_layout"] == "padded"


def test_the_probe_runs_the_trainers_packed_attention(random_model_dir: Path, rows_of) -> None:
    from polarproxy.train.attention import VARLEN
    from polarproxy.train.loop import load_model

    model = load_model(random_model_dir, torch.device("cpu"))
    assert model.config._attn_implementation == VARLEN
    assert packing_is_exact(model)
    samples = samples_from_rows(rows_of(random_model_dir, groups=1, per_group=2))
    weights = step_weights(samples, "token-mean")
    with torch.no_grad():
        h = hidden_states(model, packed_batch(samples, [0, 1], weights))
    assert h.shape[0] == sum(len(s) for s in samples)
