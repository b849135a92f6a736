"""Which micro-batch layout a model trains on: packed where packing is exact for it, padded otherwise.

Packing lays sequences end to end in one row and relies on every layer reading the restarting
position_ids as sequence boundaries. Attention does (`attention.VARLEN`, transformers' masks,
flash-attention's varlen kernel). Layers that carry a state along the row do not: Qwen3.5's gated
delta-net (linear attention) and its causal convolution run over the whole row in transformers' PyTorch
path, so the second sequence of a packed row would start from the first one's state, and its logprobs,
ratios and gradients would be those of a context the model never saw.

`packing_is_exact(model)` does not guess from the architecture: it runs two short sequences packed and
each alone and compares the hidden states. Right padding is exact for any causal model (padding comes
after every real token), so a model that fails the check trains on length-sorted padded micro-batches.
"""

from __future__ import annotations

import logging
from typing import Any

from polarproxy.train.attention import VARLEN
from polarproxy.train.data import Sample

log = logging.getLogger("polarproxy.train")

PROBE_LENGTHS = (7, 11)
# Packed and alone differ by float rounding only (~1e-6 of the hidden states' scale in float32); a state
# carried across sequences moves them by a sizeable fraction of it.
TOLERANCE = 1e-3


def packing_is_exact(model: Any) -> bool:
    """True when the model's hidden states over a packed row equal those of each sequence run alone."""
    import torch

    from polarproxy.train.batching import packed_batch, padded_batch
    from polarproxy.train.logprobs import hidden_states

    vocab = int(getattr(model.config, "vocab_size", 0) or 0) or 1000
    gen = torch.Generator().manual_seed(0)
    samples = []
    for n in PROBE_LENGTHS:
        ids = torch.randint(0, min(vocab, 1000), (n,), generator=gen).tolist()
        samples.append(Sample(ids, [0] + [1] * (n - 1), [0.0] * n, 0.0, episode_id=f"probe-{n}"))
    weights = [1.0] * len(samples)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            packed = hidden_states(model, packed_batch(samples, [0, 1], weights).to(device)).float()
            alone = torch.cat(
                [hidden_states(model, padded_batch(samples, [i], weights, 0).to(device)) for i in (0, 1)]
            ).float()
    finally:
        model.train(was_training)
    scale = float(alone.abs().max()) or 1.0
    return bool((packed - alone).abs().max() <= TOLERANCE * scale)


def choose_layout(*models: Any) -> str:
    """The layout for these models (the trained one, the reference one): "packed" when packing is exact
    for every one of them, else "padded". A model whose packed attention (`attention.VARLEN`) fails the check goes back to
    transformers' sdpa (its block-diagonal mask) and is checked again."""
    for model in models:
        if model is None or packing_is_exact(model):
            continue
        if model.config._attn_implementation == VARLEN:
            model.set_attn_implementation("sdpa")
            if packing_is_exact(model):
                log.warning(
                    "%s: per-sequence attention did not match its sequences run alone; packed rows use "
                    "transformers' sdpa with a block-diagonal mask instead.",
                    type(model).__name__,
                )
                continue
        return "padded"
    return "packed"
