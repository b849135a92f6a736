"""Per-token logprobs and entropies without the full logits: hidden states → lm_head chunk by chunk.

Only the hidden states that predict trainable tokens go through the lm_head, `chunk` rows at a time.
`_ChunkLogprobs` is one autograd function per chunk: its forward keeps only the chunk's log-normaliser
(n floats) and frees the (chunk, V) logits; its backward recomputes them once and turns them in place into
the gradient (softmax - one-hot, times the upstream gradient). Peak logit memory is chunk x V floats, not
N x V, and each chunk costs three matmuls and a few passes over its logits, where activation
checkpointing of the same computation recomputed the entropy and kept autograd's own copies of the
softmax and of the gather's one-hot. The entropy is returned detached (it is a metric, not a loss term).
`inv_temp` (one 1/T per token, or None for T = 1) scores each token at the temperature its behaviour
logprob is at (export rows' `logprob_temperatures`): log_softmax(logits / T), as SGLang returns them.
log_softmax runs in float32 (in bf16 it loses the ratio's precision), whatever the matmul's dtype under
autocast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch import Tensor


def _logits(hidden: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return torch.nn.functional.linear(hidden, weight, bias).float()


class _ChunkLogprobs(torch.autograd.Function):
    """(hidden (n, H), weight (V, H), bias (V,) or None, targets (n,), inv_temp (n,) or None) → (logprob
    of each target under softmax(logits * inv_temp) (n,), entropy (n,), not differentiable)."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        targets: Tensor,
        inv_temp: Tensor | None,
    ) -> Any:
        logits = _scaled(_logits(hidden, weight, bias), inv_temp)  # (n, V)
        top = logits.amax(dim=-1, keepdim=True)
        unnormalised = torch.sub(logits, top).exp_()  # exp(logit - max) <= 1: the one other (n, V) buffer
        total = unnormalised.sum(dim=-1, keepdim=True)  # >= 1
        logz = top + total.log()  # (n, 1): logsumexp, without its own temporaries
        logits.sub_(logz)  # now log-probabilities
        logp = logits.gather(-1, targets[:, None]).squeeze(-1)
        entropy = unnormalised.mul_(logits).sum(-1).div_(total.squeeze(-1)).neg_()  # -sum p log p
        ctx.save_for_backward(hidden, weight, bias, targets, logz, inv_temp)
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx: Any, grad_logp: Tensor, _grad_entropy: Tensor) -> Any:
        hidden, weight, bias, targets, logz, inv_temp = ctx.saved_tensors
        g = grad_logp.float()
        # d logp_t / d scaled logits = one_hot(t) - softmax; the scaled logits' gradient times inv_temp
        grad = _scaled(_logits(hidden, weight, bias), inv_temp).sub_(logz).exp_().mul_(-g[:, None])
        grad.scatter_add_(1, targets[:, None], g[:, None])
        if inv_temp is not None:
            grad.mul_(inv_temp[:, None])
        grad_hidden = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_hidden = (grad.to(weight.dtype) @ weight).to(hidden.dtype)
        if ctx.needs_input_grad[1]:
            grad_weight = (grad.T.to(hidden.dtype) @ hidden).to(weight.dtype)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = grad.sum(0).to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None


def _scaled(logits: Tensor, inv_temp: Tensor | None) -> Tensor:
    return logits if inv_temp is None else logits.mul_(inv_temp[:, None])


def chunked_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    chunk: int = 1024,
    bias: Tensor | None = None,
    inv_temp: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(logprobs (N,) float32 with grad, entropies (N,) float32 detached) of `targets` (N,) under the
    head `weight` (V, H) over `hidden` (N, H), each at temperature 1 / inv_temp (N,) (None: 1)."""
    if hidden.shape[0] == 0:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty + 0 * weight.sum(), empty
    logps, ents = [], []
    for a in range(0, hidden.shape[0], chunk):
        scale = None if inv_temp is None else inv_temp[a : a + chunk].float()
        lp, ent = _ChunkLogprobs.apply(hidden[a : a + chunk], weight, bias, targets[a : a + chunk], scale)
        logps.append(lp)
        ents.append(ent)
    return torch.cat(logps), torch.cat(ents)


def full_logprobs(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    bias: Tensor | None = None,
    inv_temp: Tensor | None = None,
) -> Tensor:
    """The same logprobs from the full (N, V) logits at once (the reference for tests)."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    if inv_temp is not None:
        logits = logits * inv_temp[:, None]
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
    return chunked_logprobs(
        hidden,
        head.weight,
        batch.targets,
        chunk=chunk,
        bias=getattr(head, "bias", None),
        inv_temp=getattr(batch, "inv_temp", None),
    )
