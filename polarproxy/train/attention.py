"""Attention over packed rows at the cost of their sequences, not of the whole row.

A packed micro-batch (`batching.packed_batch`) lays sequences end to end in one row with position_ids
restarting at 0. transformers reads the restarts and, for `sdpa`, builds a (T, T) block-diagonal mask:
every query then runs over the whole row (T^2 work and memory for a row whose sequences need only the sum
of L^2), and a masked call cannot take sdpa's causal kernel. Flash-attention's varlen kernel avoids that
on GPUs where it is installed; everywhere else the packed layout cost more than padding did (the CPU's
training step ran 0.75x the padded layout's speed).

`VARLEN` ("polarproxy_varlen") is an attention implementation registered through transformers'
`AttentionInterface` and `AttentionMaskInterface`: with no padding mask it builds no mask at all and runs
sdpa once per sequence, causal (a sliding window, where a layer has one, as a banded mask over that
sequence alone); a row with a padding mask, or a 4D mask given by the caller, goes to transformers' own
sdpa path unchanged. The numbers are sdpa's: same kernel, same scaling, each sequence on its own. What
it does not handle itself (soft-capping, attention sinks, cross-attention) goes to transformers' sdpa with
the block-diagonal mask transformers would have built (`packed_mask`).

`use_packed_attention(model)` switches a model that runs `sdpa` over to it; other implementations
(flash-attention, eager for a model that needs it) are left as they are. `layout.choose_layout` checks
the result on every model before training packs anything.
"""

from __future__ import annotations

import functools
import itertools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

VARLEN = "polarproxy_varlen"


@functools.cache
def _sdpa_has_gqa() -> bool:
    """torch >= 2.5: scaled_dot_product_attention(enable_gqa=...)."""
    from transformers.utils.import_utils import is_torch_greater_or_equal

    return bool(is_torch_greater_or_equal("2.5"))


def sequence_bounds(position_ids: Tensor) -> list[int]:
    """[0, s1, ..., T]: where the sequences of one packed row (T,) start (a position that is not the one
    before it + 1), and its end."""
    import torch

    starts = torch.nonzero(position_ids[1:] != position_ids[:-1] + 1).flatten() + 1
    return [0, *starts.tolist(), int(position_ids.shape[0])]


def _row_positions(position_ids: Tensor | None, batch: int) -> list[Tensor] | None:
    """Each batch row's position_ids (T,), or None where they cannot say where sequences start (none
    given, or multi-axis positions such as M-RoPE's (3, B, T))."""
    if position_ids is None or position_ids.dim() > 2:
        return None
    if position_ids.dim() == 1:
        return [position_ids] * batch
    if position_ids.shape[0] == batch:
        return list(position_ids)
    return [position_ids[0]] * batch if position_ids.shape[0] == 1 else None


def packed_mask(rows: list[Tensor], sliding_window: int | None) -> Tensor:
    """(B, 1, T, T) bool: a query sees the keys of its own sequence, causally (and within the window)."""
    import torch

    masks = []
    for pos in rows:
        seq = torch.zeros_like(pos)
        seq[1:] = (pos[1:] != pos[:-1] + 1).cumsum(0)
        q = torch.arange(pos.shape[0], device=pos.device)
        mask = (seq[:, None] == seq[None, :]) & (q[None, :] <= q[:, None])
        if sliding_window is not None:
            mask &= q[None, :] > q[:, None] - sliding_window
        masks.append(mask)
    return torch.stack(masks)[:, None]


def varlen_attention_forward(
    module: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    position_ids: Tensor | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """query (B, H, T, D), key/value (B, H_kv, T, D) → ((B, T, H, D), None), as transformers' attention
    functions return."""
    import torch
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    rows = _row_positions(position_ids, query.shape[0])
    causal_self = getattr(module, "is_causal", True) and query.shape[2] == key.shape[2]
    plain = kwargs.get("softcap") is None and kwargs.get("s_aux") is None
    if attention_mask is not None or rows is None or not causal_self or not plain:
        if attention_mask is None and rows is not None and causal_self:
            attention_mask = packed_mask(rows, sliding_window)  # what transformers' sdpa mask would be
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            sliding_window=sliding_window,
            position_ids=position_ids,
            **kwargs,
        )
    groups = getattr(module, "num_key_value_groups", 1)
    gqa: dict[str, bool] = {}
    if groups > 1 and _sdpa_has_gqa():  # the kernel reads each key/value head for its query heads: no copies
        gqa = {"enable_gqa": True}
    elif groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    outs = []
    for b, pos in enumerate(rows):
        parts = []
        for lo, hi in itertools.pairwise(sequence_bounds(pos)):
            q, k, v = query[b : b + 1, :, lo:hi], key[b : b + 1, :, lo:hi], value[b : b + 1, :, lo:hi]
            if sliding_window is not None and hi - lo > sliding_window:
                mask = packed_mask([pos[lo:hi]], sliding_window)[0, 0]
                parts.append(sdpa(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scaling, **gqa))
            else:
                parts.append(sdpa(q, k, v, dropout_p=dropout, is_causal=True, scale=scaling, **gqa))
        outs.append(parts[0] if len(parts) == 1 else torch.cat(parts, dim=2))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)
    return out.transpose(1, 2).contiguous(), None


def varlen_mask(*args: Any, attention_mask: Tensor | None = None, **kwargs: Any) -> Tensor | None:
    """No mask where there is no padding (the attention finds the sequences from position_ids); sdpa's
    mask otherwise."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register() -> None:
    """Make `VARLEN` known to transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN, varlen_attention_forward)
    AttentionMaskInterface.register(VARLEN, varlen_mask)


def use_packed_attention(model: Any) -> str:
    """Switch a model that runs `sdpa` to `VARLEN`; returns the implementation the model runs now."""
    current = model.config._attn_implementation
    if current != "sdpa":
        return str(current)
    register()
    model.set_attn_implementation(VARLEN)
    return str(model.config._attn_implementation)
