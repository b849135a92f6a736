"""Optimizer steps → micro-batches: rows packed by token budget, without padding.

A micro-batch is one row of the model's input, (1, T): several sequences laid end to end, their
position_ids restarting at 0 for each. transformers (>= 4.53) reads the restarts as sequence boundaries
when no attention mask is given: sdpa/eager attention get a block-diagonal causal mask, flash-attention
its varlen kernel (cu_seqlens), so no token attends across sequences; the trainer's models run
`attention.VARLEN`, which runs each sequence on its own and builds no mask. To check the boundaries,
mask_mode "4d" passes the block-diagonal mask explicitly.

Only the trainable tokens are scored: `hidden_index[k]` is the position whose hidden state predicts the
k-th trainable token `targets[k]`, so the lm_head never runs over prompt or tool tokens.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from polarproxy.train.attention import packed_mask
from polarproxy.train.data import Sample

if TYPE_CHECKING:
    from torch import Tensor


def plan_steps(
    samples: Sequence[Sample], rows_per_step: int, steps: int | None, *, seed: int = 0, shuffle: bool = True
) -> list[list[int]]:
    """Sample indices of each optimizer step. Rows of one group (or, without a group, one episode) stay in
    one step, so group baselines and episode-token-mean see them together. rows_per_step 0: every step
    takes every row. steps None: one pass over the rows; more steps cycle over them (reshuffled per pass)."""
    everything = list(range(len(samples)))
    if rows_per_step <= 0 or rows_per_step >= len(samples):
        return [everything for _ in range(steps or 1)]
    units: dict[str, list[int]] = {}
    for i, s in enumerate(samples):
        units.setdefault(s.group_id or s.episode_id, []).append(i)
    rng = random.Random(seed)
    plan: list[list[int]] = []
    while True:
        order = list(units.values())
        if shuffle:
            rng.shuffle(order)
        current: list[int] = []
        for unit in order:
            current += unit
            if len(current) >= rows_per_step:
                plan.append(current)
                current = []
                if steps is not None and len(plan) == steps:
                    return plan
        if current:
            plan.append(current)
            if steps is not None and len(plan) == steps:
                return plan
        if steps is None:
            return plan


def pack(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Indices grouped into bins of at most `token_budget` tokens (first-fit decreasing); a sequence longer
    than the budget gets a bin of its own."""
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[i]
        for b, free in enumerate(room):
            if n <= free:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(token_budget - n)
    return bins


@dataclass
class MicroBatch:
    """Model inputs and loss tensors of one micro-batch (N = trainable tokens in it, S = sequences).

    input_ids, position_ids (B, T) long; attention_mask (B, T) for padded batches, or a (1, 1, T, T) bool
    block-diagonal mask in "4d" mode, else None · hidden_index (N,) long into the flattened (B*T) positions
    · targets (N,) long · behaviour_logp, advantages, weights (N,) float32 · seq_index (N,) long in [0, S)
    · samples: indices into the step's samples · inv_temp (N,) float32: 1 / the logprob temperature of
    each trainable token, None when every one is at T = 1."""

    input_ids: Tensor
    position_ids: Tensor
    attention_mask: Tensor | None
    hidden_index: Tensor
    targets: Tensor
    behaviour_logp: Tensor
    advantages: Tensor
    weights: Tensor
    seq_index: Tensor
    n_seq: int
    samples: list[int]
    inv_temp: Tensor | None = None

    @property
    def tokens(self) -> int:
        """Tokens the model runs over (padding included)."""
        return int(self.input_ids.numel())

    def to(self, device: Any) -> MicroBatch:
        moved = {
            k: (v.to(device, non_blocking=True) if hasattr(v, "to") else v) for k, v in self.__dict__.items()
        }
        return MicroBatch(**moved)


def step_weights(
    samples: Sequence[Sample], agg: str, max_completion_length: int | None = None
) -> list[float]:
    """The aggregation weight of each sample's trainable tokens for one step (all tokens of a sample share
    it): `loss.aggregation_weights` over the step's trainable tokens (`max_completion_length`: dr-grpo's L)."""
    import torch

    from polarproxy.train.loss import aggregation_weights

    counts = torch.tensor([s.trainable_tokens for s in samples])
    episodes: dict[str, int] = {}
    ep = torch.tensor([episodes.setdefault(s.episode_id, len(episodes)) for s in samples])
    seq = torch.arange(len(samples))
    w = aggregation_weights(
        torch.ones(int(counts.sum())),
        seq.repeat_interleave(counts),
        ep.repeat_interleave(counts),
        agg,
        max_completion_length,
    )
    starts = torch.cumsum(counts, 0) - counts
    return [float(w[int(a)]) if c else 0.0 for a, c in zip(starts, counts, strict=True)]


def _loss_tensors(
    samples: Sequence[Sample], order: Sequence[int], weights: Sequence[float], offsets: Sequence[int]
):
    """hidden_index, targets, behaviour_logp, advantages, weights, seq_index, inv_temp (None: all at T = 1)
    over the trainable tokens of samples[order], sample j starting at flat position offsets[j]."""
    import torch

    hidden, targets, blp, adv, w, seq, inv = [], [], [], [], [], [], []
    scaled = any(samples[i].temperatures for i in order)
    for j, i in enumerate(order):
        s = samples[i]
        pos = [p for p in range(1, len(s)) if s.loss_mask[p]]
        hidden += [offsets[j] + p - 1 for p in pos]  # position p-1 predicts token p
        targets += [s.input_ids[p] for p in pos]
        blp += [s.logprobs[p] for p in pos]
        adv += [s.advantage] * len(pos)
        w += [weights[i]] * len(pos)
        seq += [j] * len(pos)
        if scaled:
            temps = s.temperatures
            inv += [1.0 / temps[p] for p in pos] if temps else [1.0] * len(pos)
    return (
        torch.tensor(hidden, dtype=torch.long),
        torch.tensor(targets, dtype=torch.long),
        torch.tensor(blp, dtype=torch.float32),
        torch.tensor(adv, dtype=torch.float32),
        torch.tensor(w, dtype=torch.float32),
        torch.tensor(seq, dtype=torch.long),
        torch.tensor(inv, dtype=torch.float32) if scaled else None,
    )


def packed_batch(
    samples: Sequence[Sample], order: Sequence[int], weights: Sequence[float], *, mask_mode: str = "positions"
) -> MicroBatch:
    """samples[order] end to end in one (1, T) row; mask_mode "positions" (restarting position_ids only) or
    "4d" (also an explicit block-diagonal mask)."""
    import torch

    lengths = [len(samples[i]) for i in order]
    offsets = [sum(lengths[:j]) for j in range(len(order))]
    ids = torch.tensor([t for i in order for t in samples[i].input_ids], dtype=torch.long)[None]
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    attn = packed_mask(list(pos), None) if mask_mode == "4d" else None
    if mask_mode not in ("positions", "4d"):
        raise ValueError(f"Unknown mask mode {mask_mode!r}. Must be one of 'positions', '4d'.")
    tensors = _loss_tensors(samples, order, weights, offsets)
    return MicroBatch(ids, pos, attn, *tensors[:6], len(order), list(order), inv_temp=tensors[6])


def padded_batch(
    samples: Sequence[Sample], order: Sequence[int], weights: Sequence[float], pad_id: int
) -> MicroBatch:
    """samples[order] as right-padded rows (B, T_max) with an attention mask: the usual layout, for
    comparison (and for the benchmark)."""
    import torch

    width = max(len(samples[i]) for i in order)
    ids = torch.full((len(order), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(order), width), dtype=torch.long)
    for j, i in enumerate(order):
        n = len(samples[i])
        ids[j, :n] = torch.tensor(samples[i].input_ids)
        attn[j, :n] = 1
    pos = torch.arange(width).expand(len(order), width).contiguous()
    offsets = [j * width for j in range(len(order))]
    tensors = _loss_tensors(samples, order, weights, offsets)
    return MicroBatch(ids, pos, attn, *tensors[:6], len(order), list(order), inv_temp=tensors[6])


LAYOUTS = ("packed", "padded")


def padded_groups(lengths: Sequence[int], token_budget: int, order: Sequence[int]) -> list[list[int]]:
    """Consecutive indices of `order` while rows x longest row <= token_budget (padding counts against the
    budget); a row longer than the budget gets a group of its own."""
    groups: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        n = lengths[i]
        if cur and (len(cur) + 1) * max(longest, n) > token_budget:
            groups.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        groups.append(cur)
    return groups


def micro_batches(
    samples: Sequence[Sample],
    step: Sequence[int],
    agg: str,
    token_budget: int,
    *,
    layout: str = "packed",
    mask_mode: str = "positions",
    pad_id: int = 0,
    max_completion_length: int | None = None,
) -> list[MicroBatch]:
    """The micro-batches of one step (`step`: sample indices), with the step's aggregation weights.
    layout "packed": rows end to end (first-fit decreasing, `pack`); "padded": rows sorted by length,
    right-padded to the longest of each micro-batch (`padded_groups`), for models whose packed rows are
    not exact (`layout.choose_layout`)."""
    if layout not in LAYOUTS:
        raise ValueError(f"Unknown micro-batch layout {layout!r}. Must be one of 'packed', 'padded'.")
    chosen = [samples[i] for i in step]
    weights = step_weights(chosen, agg, max_completion_length)
    lengths = [len(s) for s in chosen]
    if layout == "packed":
        bins = pack(lengths, token_budget)
    else:
        by_length = sorted(range(len(chosen)), key=lambda i: lengths[i])
        bins = padded_groups(lengths, token_budget, by_length)
    out = []
    for b in bins:
        if layout == "packed":
            mb = packed_batch(chosen, b, weights, mask_mode=mask_mode)
        else:
            mb = padded_batch(chosen, b, weights, pad_id=pad_id)
        mb.samples = [step[i] for i in b]
        out.append(mb)
    return out
