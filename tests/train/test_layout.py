"""Micro-batch layout per model: packed rows where they are exact, padded where a layer carries state along
the row (Qwen3.5's linear attention), so the trained logprobs are always those of each row alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from polarproxy.train import TrainConfig, train  # noqa: E402
from polarproxy.train.batching import micro_batches, packed_batch, step_weights  # noqa: E402
from polarproxy.train.checkpoint import META  # noqa: E402
from polarproxy.train.data import samples_from_rows  # noqa: E402
from polarproxy.train.layout import choose_layout, packing_is_exact  # noqa: E402
from polarproxy.train.logprobs import hidden_states  # noqa: E402
from polarproxy.train.metrics import read_metrics  # noqa: E402


@pytest.fixture(scope="module")
def qwen3_5_dir(tmp_path_factory, tiny_models) -> Path:
    d = tmp_path_factory.mktemp("qwen3_5")
    tiny_models[1](vocab_size=512).save_pretrained(d)
    return d


def test_packing_carries_linear_attention_state_across_sequences(
    qwen3_5_dir: Path, rows_of, three_ways
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(qwen3_5_dir), dtype=torch.float32).eval()
    samples = samples_from_rows(rows_of(qwen3_5_dir, groups=1, per_group=3))
    packed, padded, own = three_ways(model, samples)  # own: each row scored alone
    # why the layout exists: packed, the later rows start from the earlier rows' state
    assert (packed - own).abs().max() > 1e-3
    assert torch.allclose(padded, own, atol=1e-4)
    model.train()
    assert not packing_is_exact(model)
    assert model.training  # the probe gives the model back in the mode it found it


def test_attention_only_models_pack(random_model_dir: Path, tiny_models) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(random_model_dir), dtype=torch.float32)
    assert packing_is_exact(model)
    assert choose_layout(model, None) == "packed"
    assert choose_layout(model, tiny_models[1]()) == "padded"  # a reference model that cannot pack


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
