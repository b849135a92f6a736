"""Per-token logprobs and entropies without the full logits: hidden states → lm_head chunk by chunk.

Only the hidden states that predict trainable tokens go through the lm_head, `chunk` rows at a time.
Each chunk runs under activation checkpointing, so its (chunk, V) logits are freed after the forward
pass and recomputed one chunk at a time in the backward pass: peak logit memory is chunk x V floats,
not N x V. log_softmax runs in float32 (in bf16 it loses the ratio's precision), whatever the matmul's
dtype under autocast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.utils.checkpoint import checkpoint

if TYPE_CHECKING:
    from torch import Tensor


def _chunk_logprobs(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor
) -> tuple[Tensor, Tensor]:
    """hidden (n, H), weight (V, H), targets (n,) → (logprob of the target (n,), entropy (n,))."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float()  # (n, V)
    logz = torch.logsumexp(logits, dim=-1)  # (n,)
    logp = logits.gather(-1, targets[:, None]).squeeze(-1) - logz
    probs = torch.softmax(logits, dim=-1)
    entropy = logz - (probs * logits).sum(-1)
    return logp, entropy


def chunked_logprobs(
    hidden: Tensor, weight: Tensor, targets: Tensor, *, chunk: int = 1024, bias: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """(logprobs (N,) float32 with grad, entropies (N,) float32 detached) of `targets` (N,) under the
    head `weight` (V, H) over `hidden` (N, H)."""
    if hidden.shape[0] == 0:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty + 0 * weight.sum(), empty
    need_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    logps, ents = [], []
    for a in range(0, hidden.shape[0], chunk):
        h, t = hidden[a : a + chunk], targets[a : a + chunk]
        if need_grad:
            lp, ent = checkpoint(_chunk_logprobs, h, weight, bias, t, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(h, weight, bias, t)
        logps.append(lp)
        ents.append(ent.detach())
    return torch.cat(logps), torch.cat(ents)


def full_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None = None) -> Tensor:
    """The same logprobs from the full (N, V) logits at once (the reference for tests)."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    return torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)


def decoder_and_head(model: Any) -> tuple[Any, Any]:
    """(the decoder that returns hidden states, the lm_head Linear) of a transformers causal LM."""
    head = model.get_output_embeddings()
    decoder = getattr(model, model.base_model_prefix, None)
    if head is None or decoder is None or decoder is model:
        raise ValueError(
            f"{type(model).__name__} has no separate decoder and lm_head; cannot score chunk-wise."
        )
    return decoder, head


def hidden_states(model: Any, batch: Any) -> Tensor:
    """(B*T, H) last hidden states of a MicroBatch (packed or padded)."""
    decoder, _head = decoder_and_head(model)
    kwargs: dict[str, Any] = {
        "input_ids": batch.input_ids,
        "position_ids": batch.position_ids,
        "use_cache": False,
    }
    if batch.attention_mask is not None:
        kwargs["attention_mask"] = batch.attention_mask
    out = decoder(**kwargs).last_hidden_state
    return out.reshape(-1, out.shape[-1])


def batch_logprobs(model: Any, batch: Any, *, chunk: int = 1024) -> tuple[Tensor, Tensor]:
    """(logprobs (N,), entropies (N,)) of a MicroBatch's trainable tokens under `model`."""
    _decoder, head = decoder_and_head(model)
    hidden = hidden_states(model, batch)[batch.hidden_index]
    return chunked_logprobs(hidden, head.weight, batch.targets, chunk=chunk, bias=getattr(head, "bias", None))
