"""The GRPO loss against a naive per-token loop of the formula, on random tensors."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from polarproxy.train.loss import (  # noqa: E402
    LossSettings,
    aggregation_weights,
    clipped_surrogate,
    grpo_loss,
)

AGGS = ("token-mean", "seq-mean-token-mean", "episode-token-mean", "dr-grpo")
DR_GRPO_LENGTH = 16  # Dr. GRPO's constant L in the tests (TRL's max_completion_length)


def _random_batch(seed: int, n_seq: int = 6, max_len: int = 12):
    """Flat tensors of n_seq sequences of random lengths, 3 episodes, ratios spread past both clip bounds."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, max_len, (n_seq,), generator=g)
    seq_index = torch.repeat_interleave(torch.arange(n_seq), lengths)
    n = int(lengths.sum())
    episode_of_seq = torch.tensor([i % 3 for i in range(n_seq)])
    logp = -torch.rand(n, generator=g, dtype=torch.float64) * 3
    behaviour = logp + torch.randn(n, generator=g, dtype=torch.float64) * 0.6
    seq_adv = torch.randn(n_seq, generator=g, dtype=torch.float64)
    advantages = seq_adv[seq_index]
    mask = (torch.rand(n, generator=g) < 0.75).to(torch.float64)
    ref = logp + torch.randn(n, generator=g, dtype=torch.float64) * 0.3
    return logp, behaviour, advantages, mask, seq_index, episode_of_seq[seq_index], n_seq, ref


def _naive(logp, behaviour, adv, mask, seq, ep, agg, s: LossSettings, ref=None):
    """The formula, token by token, with python loops (torch scalars so that autograd can check gradients)."""
    n = len(logp)
    old = [logp[t].detach() if s.tis_cap is not None else behaviour[t] for t in range(n)]
    seq_lr = {}
    for k in set(seq.tolist()):
        toks = [t for t in range(n) if seq[t] == k and mask[t] == 1]
        seq_lr[k] = sum(logp[t] - old[t] for t in toks) / len(toks) if toks else 0.0
    losses = {}
    for t in range(n):
        if mask[t] == 0:
            continue
        lr = logp[t] - old[t] if s.importance_level == "token" else seq_lr[int(seq[t])]
        r = torch.exp(lr) if torch.is_tensor(lr) else torch.tensor(math.exp(lr), dtype=torch.float64)
        a = adv[t]
        unclipped = -r * a
        clipped = -torch.clamp(r, 1 - s.clip_low, 1 + s.clip_high) * a
        loss = torch.maximum(unclipped, clipped)
        if s.dual_clip is not None and a < 0:
            loss = torch.minimum(loss, -s.dual_clip * a)
        if s.tis_cap is not None:
            loss = loss * min(math.exp(float(logp[t].detach() - behaviour[t])), s.tis_cap)
        if ref is not None and s.kl_coef:
            d = ref[t] - logp[t]
            loss = loss + s.kl_coef * torch.exp(logp[t] - old[t]) * (torch.exp(d) - d - 1)
        losses[t] = loss
    if agg == "token-mean":
        return sum(losses.values()) / len(losses)
    if agg == "dr-grpo":  # TRL's: the masked sum over (rows x max_completion_length)
        return sum(losses.values()) / (len(set(seq.tolist())) * DR_GRPO_LENGTH)
    key = seq if agg == "seq-mean-token-mean" else ep
    groups: dict[int, list] = {}
    for t, v in losses.items():
        groups.setdefault(int(key[t]), []).append(v)
    return sum(sum(vs) / len(vs) for vs in groups.values()) / len(groups)


SETTINGS = {
    "clip": LossSettings(clip_low=0.2, clip_high=0.28),
    "dual-clip": LossSettings(clip_low=0.2, clip_high=0.28, dual_clip=1.5),
    "tis": LossSettings(clip_low=0.2, clip_high=0.28, tis_cap=1.2),
    "sequence": LossSettings(clip_low=0.1, clip_high=0.1, importance_level="sequence"),
    "kl": LossSettings(clip_low=0.2, clip_high=0.28, kl_coef=0.1),
}


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("name", list(SETTINGS))
def test_loss_and_gradient_match_the_naive_formula(agg: str, name: str) -> None:
    s = SETTINGS[name]
    logp, behaviour, adv, mask, seq, ep, n_seq, ref = _random_batch(
        seed=AGGS.index(agg) * 10 + list(SETTINGS).index(name)
    )
    ref_arg = ref if s.kl_coef else None
    p1 = logp.clone().requires_grad_(True)
    weights = aggregation_weights(mask, seq, ep, agg, DR_GRPO_LENGTH).to(torch.float64)
    loss, stats = grpo_loss(p1, behaviour, adv, mask, weights, seq, n_seq, s, ref_arg)
    loss.backward()
    p2 = logp.clone().requires_grad_(True)
    expected = _naive(p2, behaviour, adv, mask, seq, ep, agg, s, ref_arg)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-7)
    assert torch.allclose(p1.grad, p2.grad, rtol=1e-5, atol=1e-7)
    assert stats["tokens"].item() == mask.sum().item()


def test_random_batch_reaches_both_clip_bounds_and_the_dual_clip() -> None:
    logp, behaviour, adv, *_ = _random_batch(seed=1, n_seq=12)
    ratio = torch.exp(logp - behaviour)
    _loss, active = clipped_surrogate(ratio, adv, 0.2, 0.28, dual_clip=1.5)
    assert ((ratio < 0.8) & (adv < 0)).any() and ((ratio > 1.28) & (adv > 0)).any()
    assert ((ratio > 1.5) & (adv < 0)).any()  # the dual clip's branch
    assert active.any() and not active.all()


def test_clip_branches_have_no_gradient_and_dual_clip_caps_negative_advantages() -> None:
    ratio = torch.tensor([0.5, 1.5, 0.5, 1.5, 3.0, 1.0], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([-1.0, 1.0, 1.0, -1.0, -1.0, 2.0], dtype=torch.float64)
    loss, active = clipped_surrogate(ratio, adv, 0.2, 0.28, dual_clip=2.0)
    loss.sum().backward()
    # low-clipped with A<0 and high-clipped with A>0: constant, no gradient
    assert active.tolist() == [True, True, False, False, True, False]
    assert ratio.grad.tolist()[:2] == [0.0, 0.0]
    # unclipped branch on the pessimistic side: gradient -A
    assert ratio.grad.tolist()[2:4] == [-1.0, 1.0]
    # dual clip: ratio 3 > c=2 with A=-1 gives loss c*|A| = 2 and no gradient
    assert loss[4].item() == 2.0 and ratio.grad[4].item() == 0.0
    assert loss[5].item() == -2.0


def test_ratio_one_is_reinforce_with_a_group_baseline() -> None:
    g = torch.Generator().manual_seed(3)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64)  # one group of four rows
    adv_per_seq = rewards - rewards.mean()
    lengths = torch.tensor([3, 5, 2, 4])
    seq = torch.repeat_interleave(torch.arange(4), lengths)
    logp = (-torch.rand(int(lengths.sum()), generator=g, dtype=torch.float64)).requires_grad_(True)
    mask = torch.ones_like(logp)
    weights = aggregation_weights(mask, seq, seq, "token-mean").to(torch.float64)
    loss, _ = grpo_loss(logp, logp.detach(), adv_per_seq[seq], mask, weights, seq, 4, LossSettings())
    loss.backward()
    # REINFORCE: ∇ = -Σ_t (r - mean r) ∇logp_t / T
    assert torch.allclose(logp.grad, -adv_per_seq[seq] / len(logp))
    assert loss.item() == pytest.approx(-(adv_per_seq[seq]).mean().item())


def test_zero_advantages_give_zero_gradient() -> None:
    logp, behaviour, _adv, mask, seq, ep, n_seq, _ref = _random_batch(seed=5)
    p = logp.clone().requires_grad_(True)
    weights = aggregation_weights(mask, seq, ep, "token-mean").to(torch.float64)
    loss, _ = grpo_loss(p, behaviour, torch.zeros_like(p), mask, weights, seq, n_seq, SETTINGS["dual-clip"])
    loss.backward()
    assert loss.item() == 0.0
    assert torch.count_nonzero(p.grad) == 0


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_masked_tokens_get_no_gradient(level: str) -> None:
    logp, behaviour, adv, mask, seq, ep, n_seq, _ref = _random_batch(seed=7)
    assert (mask == 0).any()
    p = logp.clone().requires_grad_(True)
    weights = aggregation_weights(mask, seq, ep, "seq-mean-token-mean").to(torch.float64)
    settings = LossSettings(importance_level=level)
    loss, _ = grpo_loss(p, behaviour, adv, mask, weights, seq, n_seq, settings)
    loss.backward()
    assert torch.count_nonzero(p.grad[mask == 0]) == 0
    assert torch.count_nonzero(p.grad[mask == 1]) > 0


def test_aggregation_weights_sum_to_one_and_follow_their_unit() -> None:
    mask = torch.tensor([1, 1, 1, 0, 1, 1, 0, 0, 1.0])
    seq = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 3])  # sequence 2 has no trainable token
    ep = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1])
    tm = aggregation_weights(mask, seq, ep, "token-mean")
    sm = aggregation_weights(mask, seq, ep, "seq-mean-token-mean")
    em = aggregation_weights(mask, seq, ep, "episode-token-mean")
    for w in (tm, sm, em):
        assert w.sum().item() == pytest.approx(1.0)
        assert w[mask == 0].abs().sum().item() == 0
    assert sm.tolist()[:3] == pytest.approx([1 / 9] * 3) and sm[8].item() == pytest.approx(1 / 3)
    assert em.tolist()[:3] == pytest.approx([1 / 10] * 3) and em[8].item() == pytest.approx(1 / 2)
    with pytest.raises(ValueError, match="Unknown loss aggregation"):
        aggregation_weights(mask, seq, ep, "sum")


def test_the_kl_term_has_the_gradient_of_kl_pi_to_ref_not_of_kl_ref_to_pi() -> None:
    """On a small categorical distribution, the expected KL term over tokens sampled from π_old = π has the
    exact gradient of KL(π || π_ref); k3 alone would give that of KL(π_ref || π)."""
    from polarproxy.train.loss import k3_kl, kl_term

    g = torch.Generator().manual_seed(3)
    theta = torch.randn(7, generator=g, dtype=torch.float64, requires_grad=True)
    ref_logp = torch.log_softmax(torch.randn(7, generator=g, dtype=torch.float64), 0)

    def expected(term):  # Σ_x π_old(x) term(x): the expectation over sampled tokens, exactly
        logp = torch.log_softmax(theta, 0)
        return (logp.detach().exp() * term(logp)).sum()

    (ours,) = torch.autograd.grad(expected(lambda lp: kl_term(lp, lp.detach(), ref_logp)), theta)
    (naive,) = torch.autograd.grad(expected(lambda lp: k3_kl(lp, ref_logp)), theta)
    logp = torch.log_softmax(theta, 0)
    (forward,) = torch.autograd.grad((logp.exp() * (logp - ref_logp)).sum(), theta)  # KL(π || π_ref)
    logp = torch.log_softmax(theta, 0)
    (reverse,) = torch.autograd.grad((ref_logp.exp() * (ref_logp - logp)).sum(), theta)  # KL(π_ref || π)
    assert torch.allclose(ours, forward, atol=1e-12)
    assert torch.allclose(naive, reverse, atol=1e-12) and not torch.allclose(ours, reverse, atol=1e-3)


def test_dr_grpo_divides_by_rows_times_the_max_completion_length_whatever_the_lengths() -> None:
    mask = torch.tensor([1, 1, 1, 0, 1], dtype=torch.float64)
    seq = torch.tensor([0, 0, 0, 1, 1])
    w = aggregation_weights(mask, seq, seq, "dr-grpo", 10)
    assert w.tolist() == pytest.approx([0.05, 0.05, 0.05, 0.0, 0.05])  # 1 / (2 rows x 10)
    default = aggregation_weights(mask, seq, seq, "dr-grpo")  # L: the most trainable tokens of one row (3)
    assert default.tolist() == pytest.approx([1 / 6, 1 / 6, 1 / 6, 0.0, 1 / 6])
