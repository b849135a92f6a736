"""Packing: bins respect the token budget, steps keep groups together, and a packed micro-batch gives the
loss and gradients of the same rows run one by one."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from polarproxy.train.attention import VARLEN, use_packed_attention  # noqa: E402
from polarproxy.train.batching import (  # noqa: E402
    micro_batches,
    pack,
    packed_batch,
    padded_batch,
    plan_steps,
    step_weights,
)
from polarproxy.train.data import samples_from_rows  # noqa: E402
from polarproxy.train.logprobs import batch_logprobs  # noqa: E402
from polarproxy.train.loss import LossSettings, aggregation_weights, grpo_loss  # noqa: E402


def test_pack_fills_bins_within_the_budget_and_keeps_every_sequence() -> None:
    lengths = [700, 64, 2048, 300, 300, 90, 1000, 5000, 1]
    bins = pack(lengths, 2048)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    for b in bins:
        assert len(b) == 1 or sum(lengths[i] for i in b) <= 2048
    assert [7] in bins  # longer than the budget: a bin of its own
    assert len(bins) <= 6


def test_steps_keep_a_group_together(scored_rows) -> None:
    samples = samples_from_rows(scored_rows)
    plan = plan_steps(samples, rows_per_step=2, steps=5, seed=1)
    assert len(plan) == 5
    for step in plan:
        groups = {samples[i].group_id for i in step}
        for g in groups:  # every row of each group that the step touches
            assert {i for i, s in enumerate(samples) if s.group_id == g} <= set(step)
    assert plan_steps(samples, 0, None) == [list(range(len(samples)))]


def test_step_weights_are_the_aggregation_weights_per_row(scored_rows) -> None:
    samples = samples_from_rows(scored_rows)
    samples[1].episode_id = samples[0].episode_id  # one episode exported as two rows
    for agg in ("token-mean", "seq-mean-token-mean", "episode-token-mean"):
        w = step_weights(samples, agg)
        counts = [s.trainable_tokens for s in samples]
        assert sum(wi * c for wi, c in zip(w, counts, strict=True)) == pytest.approx(1.0)
    w = step_weights(samples, "episode-token-mean")
    assert w[0] == w[1] == pytest.approx(1 / ((counts[0] + counts[1]) * (len(samples) - 1)))


def _loss_and_grads(model, batches, settings):
    model.zero_grad(set_to_none=True)
    total = 0.0
    for mb in batches:
        logp, _ = batch_logprobs(model, mb, chunk=7)
        mask = torch.ones_like(logp)
        loss, _ = grpo_loss(
            logp, mb.behaviour_logp, mb.advantages, mask, mb.weights, mb.seq_index, mb.n_seq, settings
        )
        loss.backward()
        total += loss.item()
    return total, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    ("mask_mode", "attention"), [("positions", "sdpa"), ("4d", "sdpa"), ("positions", VARLEN), ("4d", VARLEN)]
)
def test_packed_batch_gives_the_loss_and_gradients_of_the_unpacked_rows(
    random_model_dir: Path, scored_rows, mask_mode: str, attention: str
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(random_model_dir), dtype=torch.float32)
    if attention == VARLEN:
        assert use_packed_attention(model) == VARLEN
    model.train()
    samples = samples_from_rows(scored_rows)
    for s in samples:  # ratios away from 1, so the clip matters too
        s.logprobs = [
            lp + 0.15 * ((i % 5) - 2) if m else 0.0
            for i, (lp, m) in enumerate(zip(s.logprobs, s.loss_mask, strict=True))
        ]
    settings = LossSettings(importance_level="token")
    order = list(range(len(samples)))
    weights = step_weights(samples, "seq-mean-token-mean")
    packed = [packed_batch(samples, order, weights, mask_mode=mask_mode)]
    assert packed[0].input_ids.shape == (1, sum(len(s) for s in samples))
    one_by_one = [padded_batch(samples, [i], weights, pad_id=0) for i in order]
    loss_p, grads_p = _loss_and_grads(model, packed, settings)
    loss_u, grads_u = _loss_and_grads(model, one_by_one, settings)
    assert loss_p == pytest.approx(loss_u, abs=1e-5)
    assert grads_p.keys() == grads_u.keys() and grads_p
    for name in grads_p:
        assert torch.allclose(grads_p[name], grads_u[name], atol=1e-5, rtol=1e-4), name


def test_padded_batch_of_many_rows_matches_the_packed_one(
    random_model_dir: Path, scored_rows, three_ways
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(random_model_dir), dtype=torch.float32).eval()
    lp_packed, lp_padded, behaviour = three_ways(model, samples_from_rows(scored_rows))
    assert torch.allclose(lp_packed, lp_padded, atol=1e-5)
    # behaviour logprobs are the model's own: ratio 1
    assert torch.allclose(lp_packed, behaviour, atol=1e-4)


def test_micro_batches_split_by_budget_and_cover_every_trainable_token(scored_rows) -> None:
    samples = samples_from_rows(scored_rows)
    step = list(range(len(samples)))
    mbs = micro_batches(samples, step, "token-mean", token_budget=64)
    assert len(mbs) > 1
    assert sorted(i for mb in mbs for i in mb.samples) == step
    assert sum(int(mb.targets.numel()) for mb in mbs) == sum(s.trainable_tokens for s in samples)
    assert sum(float(mb.weights.sum()) for mb in mbs) == pytest.approx(1.0)
    for mb in mbs:
        assert mb.tokens <= 64 or len(mb.samples) == 1
        ones = torch.ones_like(mb.weights)
        seqs = mb.seq_index
        assert torch.allclose(
            mb.weights / mb.weights.sum(), aggregation_weights(ones, seqs, seqs, "token-mean")
        )
