"""liger-kernel's fused linear GRPO loss (lm_head + loss in one chunked kernel), where it computes the same
loss as `loss.grpo_loss`: CUDA, liger importable, token-mean aggregation, no dual clip, no TIS, no KL.

Liger takes padded (B, T, H) hidden states with one advantage per row, so the trainable tokens' hidden
states of each packed sequence are laid out as one padded row (hidden states only: cheap next to
logits). Its "bnpo" loss is the micro-batch's token mean; scaled by (micro-batch tokens / step tokens) it
is this step's token mean. liger's signature has changed between releases, so the loop checks the first
micro-batch against the plain loss and falls back to it (saying so) if they differ or liger fails.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch import Tensor

    from polarproxy.train.batching import MicroBatch
    from polarproxy.train.config import TrainConfig


def fits(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether the fused loss can stand in for the plain one under these settings."""
    if cfg.fused_loss == "off" or device.type != "cuda":
        return False
    if cfg.loss_agg != "token-mean" or cfg.dual_clip is not None or cfg.tis_cap is not None or cfg.kl_coef:
        return False
    try:
        import liger_kernel.chunked_loss  # noqa: F401
    except ImportError:
        return False
    return True


class LigerLoss:
    def __init__(self, cfg: TrainConfig) -> None:
        from liger_kernel.chunked_loss import LigerFusedLinearGRPOLoss

        self.fn = LigerFusedLinearGRPOLoss(
            beta=0.0,
            use_ref_model=False,
            epsilon_low=cfg.clip_low,
            epsilon_high=cfg.clip_high,
            loss_type="bnpo",
            importance_sampling_level=cfg.importance_level,
            chunk_size=1,
            compiled=True,
        )

    def __call__(self, hidden: Tensor, head: Any, mb: MicroBatch) -> Tensor:
        """The micro-batch's share of the step's token-mean loss. hidden (N, H): the trainable tokens'."""
        n_seq = mb.n_seq
        counts = torch.bincount(mb.seq_index, minlength=n_seq)  # (S,)
        width = int(counts.max())
        starts = torch.cumsum(counts, 0) - counts
        col = torch.arange(mb.seq_index.numel(), device=hidden.device) - starts[mb.seq_index]  # (N,)
        padded = hidden.new_zeros(n_seq, width, hidden.shape[-1]).index_put((mb.seq_index, col), hidden)
        ids = mb.targets.new_zeros(n_seq, width).index_put((mb.seq_index, col), mb.targets)
        mask = torch.zeros(n_seq, width, device=hidden.device).index_put(
            (mb.seq_index, col), torch.ones_like(mb.behaviour_logp)
        )
        old = torch.zeros(n_seq, width, device=hidden.device).index_put(
            (mb.seq_index, col), mb.behaviour_logp
        )
        adv = torch.zeros(n_seq, device=hidden.device).index_put((mb.seq_index,), mb.advantages)
        out = self.fn(
            _input=padded,
            lin_weight=head.weight,
            selected_token_ids=ids,
            attention_mask=mask,
            advantages=adv,
            bias=getattr(head, "bias", None),
            old_per_token_logps=old,
        )
        loss = out[0] if isinstance(out, tuple) else out
        # bnpo = mean over this micro-batch's tokens; weights[t] = 1 / step tokens (token-mean)
        return loss * mb.weights.sum()
