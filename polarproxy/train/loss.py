"""The GRPO loss as pure functions over flat (packed) token tensors, after TRL's `_compute_loss` and
nanochat's `chat_rl.py`.

Every tensor here has one entry per *predicted* token of a micro-batch, N of them, from every sequence
packed into it: `logp[t]` is the policy's logprob of token t, `behaviour_logp[t]` the one the inference
engine recorded when it sampled t, `mask[t]` 1 where t is trainable, `seq_index[t]` which sequence
(0..S-1) t belongs to. Sequences never share a token, so nothing here needs padding.

    rho_t   = exp(logp_t - behaviour_logp_t)                       (token level)
    rho_t   = exp(mean_{u in seq(t), mask} (logp_u - behaviour_u))  (sequence level, GSPO)
    pg_t  = -min(rho_t A, clip(rho_t, 1 - ε_low, 1 + ε_high) A)        (TRL / DAPO clip-higher)
    pg_t  = min(pg_t, -c A)  where A < 0                           (dual clip, c > 1)
    loss  = Σ_t w_t (pg_t + β rho_t k3_t),  k3_t = exp(r_t - logp_t) - (r_t - logp_t) - 1   (r: reference)

The KL term is weighted by the token's importance ratio rho_t = π/π_old (with its gradient; 1 in value at
the start of the step): k3 alone has the gradient of KL(π_ref || π), k3 times the ratio that of the
KL(π || π_ref) it estimates (as DeepSeek-V3.2 and TRL's `use_bias_correction_kl` do).

`w_t` are the aggregation weights (`aggregation_weights`): token-mean (1/#tokens of the step),
seq-mean-token-mean (each sequence's tokens averaged, then the sequences), episode-token-mean (one
token-weighted mean per episode over all of its rows, then the episodes: slime's reducer, for episodes
exported as many per-call rows), dr-grpo (1/(#rows of the step x L), L the max completion length: Dr.
GRPO's constant normaliser, as TRL's `loss_type="dr_grpo"`). They are computed once for the whole optimizer step and split with the
tokens, so gradient accumulation over micro-batches gives exactly the loss of the full batch.

Truncated importance sampling (`tis_cap` C, for train/inference mismatch): the clipped ratio is taken
against the trainer's own logprobs at the start of the step (one update per batch, so rho = 1 in value and
carries the policy gradient), and each token is weighted by the detached, capped behaviour correction
min(exp(logp - behaviour_logp), C), as in TRL's `vllm_importance_sampling_cap` and Yao et al.'s TIS.

Left out: several PPO epochs per batch (no stored proximal logprobs), value functions/GAE, entropy
bonus, sequence-level TIS, per-token advantages (one advantage per row), logit soft-capping and sampling
temperature (logprobs are of the raw logits, as the local backend and SGLang record them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True, slots=True)
class LossSettings:
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None
    tis_cap: float | None = None
    importance_level: str = "token"  # "token" | "sequence"
    kl_coef: float = 0.0


def segment_sum(values: Tensor, index: Tensor, n: int) -> Tensor:
    """(N,) values summed per segment → (n,)."""
    return torch.zeros(n, dtype=values.dtype, device=values.device).index_add_(0, index, values)


def aggregation_weights(
    mask: Tensor, seq_index: Tensor, episode_index: Tensor, agg: str, max_completion_length: int | None = None
) -> Tensor:
    """(N,) weight of each token's loss so that Σ_t w_t l_t is the chosen mean; 0 on masked tokens.

    mask (N,) 0/1 · seq_index (N,) in [0, S) · episode_index (N,) in [0, E) · agg: token-mean |
    seq-mean-token-mean | episode-token-mean | dr-grpo (1/(S·L), L = `max_completion_length`, default the
    most trainable tokens of one sequence). Segments without a trainable token do not count."""
    m = mask.to(torch.float64)
    if agg == "token-mean":
        return (m / m.sum().clamp(min=1)).to(torch.float32)
    if agg == "dr-grpo":
        n = int(seq_index.max().item()) + 1 if seq_index.numel() else 0
        counts = segment_sum(m, seq_index, n)
        length = max_completion_length or int(counts.max().item() if n else 1)
        return (m / (max(n, 1) * max(length, 1))).to(torch.float32)
    if agg == "seq-mean-token-mean":
        index = seq_index
    elif agg == "episode-token-mean":
        index = episode_index
    else:
        raise ValueError(f"Unknown loss aggregation {agg!r}")
    n = int(index.max().item()) + 1 if index.numel() else 0
    counts = segment_sum(m, index, n)  # (n,) trainable tokens per segment
    segments = (counts > 0).sum().clamp(min=1)
    return (m / (counts[index].clamp(min=1) * segments)).to(torch.float32)


def log_ratio(
    logp: Tensor, old_logp: Tensor, mask: Tensor, seq_index: Tensor, n_seq: int, level: str
) -> Tensor:
    """(N,) log importance ratio per token: logp - old_logp (token level), or the sequence's masked mean of
    it broadcast to the sequence's tokens (sequence level, GSPO). Masked tokens give 0."""
    m = mask.to(logp.dtype)
    diff = (logp - old_logp) * m
    if level == "token":
        return diff
    if level != "sequence":
        raise ValueError(f"Unknown importance level {level!r}")
    per_seq = segment_sum(diff, seq_index, n_seq) / segment_sum(m, seq_index, n_seq).clamp(min=1)  # (S,)
    return per_seq[seq_index] * m


def clipped_surrogate(
    ratio: Tensor, advantages: Tensor, clip_low: float, clip_high: float, dual_clip: float | None = None
) -> tuple[Tensor, Tensor]:
    """(per-token loss (N,), whether a clip bound was active (N,) bool) of -min(rhoA, clip(rho)A), with the
    dual clip min(·, -cA) on negative advantages when `dual_clip` c is set."""
    unclipped = -ratio * advantages
    clipped = -torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    active = ((ratio < 1 - clip_low) & (advantages < 0)) | ((ratio > 1 + clip_high) & (advantages > 0))
    if dual_clip is not None:
        cap = -dual_clip * advantages
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(advantages < 0, torch.minimum(loss, cap), loss)
        active = active | dual
    return loss, active


def tis_weights(logp: Tensor, behaviour_logp: Tensor, cap: float) -> Tensor:
    """(N,) detached truncated importance weights min(π_train / π_behaviour, cap)."""
    return torch.exp(logp.detach() - behaviour_logp).clamp(max=cap)


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """(N,) Schulman's k3 estimator of KL(π || π_ref) in value: exp(r - p) - (r - p) - 1 ≥ 0. Its gradient
    alone is that of KL(π_ref || π): weight it by the importance ratio (`kl_term`) to train on the KL it
    names."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def kl_term(logp: Tensor, old_logp: Tensor, ref_logp: Tensor) -> Tensor:
    """(N,) rho · k3 with rho = exp(logp - old_logp) carrying its gradient: in expectation over tokens sampled
    from π_old, the gradient of KL(π || π_ref) (the k3 value of it at rho = 1)."""
    return torch.exp(logp - old_logp) * k3_kl(logp, ref_logp)


def grpo_loss(
    logp: Tensor,
    behaviour_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    weights: Tensor,
    seq_index: Tensor,
    n_seq: int,
    settings: LossSettings,
    ref_logp: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """(the micro-batch's share of the step loss, detached sums for the metrics).

    logp (N,) float32 with grad · behaviour_logp, advantages, weights (N,) · mask (N,) 0/1 · seq_index
    (N,) in [0, n_seq) · ref_logp (N,) or None. The sums: tokens, ratio_sum, ratio_max, clipped, kl_sum,
    tis_capped (all over trainable tokens; ratio is π_θ/π_behaviour)."""
    m = mask.to(logp.dtype)
    old = logp.detach() if settings.tis_cap is not None else behaviour_logp
    lr = log_ratio(logp, old, m, seq_index, n_seq, settings.importance_level)
    ratio = torch.exp(lr)
    per_token, active = clipped_surrogate(
        ratio, advantages, settings.clip_low, settings.clip_high, settings.dual_clip
    )
    is_w = None
    if settings.tis_cap is not None:
        is_w = tis_weights(logp, behaviour_logp, settings.tis_cap)
        per_token = per_token * is_w
    kl = None
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp)
        if settings.kl_coef:
            per_token = per_token + settings.kl_coef * kl_term(logp, old, ref_logp)
    loss = (per_token * weights * m).sum()

    with torch.no_grad():
        on = m.bool()
        behaviour_ratio = torch.exp(logp.detach() - behaviour_logp)[on]
        stats = {
            "tokens": m.sum(),
            "ratio_sum": behaviour_ratio.sum(),
            "ratio_max": behaviour_ratio.max() if behaviour_ratio.numel() else m.new_zeros(()),
            "clipped": (active & on).sum().to(m.dtype),
            "kl_sum": (kl.detach() * m).sum() if kl is not None else m.new_zeros(()),
            "tis_capped": ((is_w >= settings.tis_cap) & on).sum().to(m.dtype)
            if is_w is not None
            else m.new_zeros(()),
        }
    return loss, stats
