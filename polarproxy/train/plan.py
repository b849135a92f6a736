"""`train --plan`: the memory and disk a run needs, from the model's config alone (the model is built on
torch's meta device: no weights are read or allocated), for the device it will run on.

The terms, in bytes, with P the parameters (exact: counted on the meta model, tied weights once):

- weights: 4P (fp32 master weights: an lr of 1e-6 would vanish in bf16 weights);
- gradients: 4P; AdamW state: 8P (two fp32 moments); on CUDA the optimizer is fused (no temporary), on the
  CPU a foreach step adds a temporary of about 4P;
- activations at `--token-budget` T tokens per micro-batch, h the hidden size, L layers, I the MLP size, V
  the vocabulary, c `--logprob-chunk`, a the activation bytes (2 under bf16 autocast, else 4): with gradient
  checkpointing L·T·h·a kept between layers plus one layer recomputed, T·(8h + 3I)·a; without it
  L·T·(8h + 3I)·a; and the logprob chunk's logits and their gradient, 2·c·V·4;
- the reference model (`--kl-coef`): 2P on CUDA (bf16: it only scores), 4P on the CPU;
- under bf16 autocast, the bf16 copies of the weights autocast keeps while it runs: 2P;
- peak: weights + gradients + AdamW state + reference + the larger of the activations and the optimizer's
  temporary.

On disk, each checkpoint holds the weights the backend loads from that folder (`--save-dtype`: bf16 on
CUDA, 2P; fp32 on the CPU, 4P) and, where it saves it, the optimizer state (8P) with, when the folder's
weights are bf16, the fp32 master weights (4P) that `--resume` continues from; a sync makes the backend
read that folder.

An estimate of activations (kernels keep their own workspaces, allocators fragment): `bench/train_gpu.py`
compares it with the peak torch measures on a GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from polarproxy.train.config import TrainConfig

GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class ModelShape:
    params: int
    layers: int
    hidden: int
    intermediate: int
    vocab: int


def model_shape(model_dir: str | os.PathLike[str]) -> ModelShape:
    """The parameter count (built on the meta device from config.json alone) and the dimensions."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    text = getattr(config, "text_config", None) or config
    return ModelShape(
        params=sum(p.numel() for p in model.parameters()),
        layers=int(text.num_hidden_layers),
        hidden=int(text.hidden_size),
        intermediate=int(getattr(text, "intermediate_size", 4 * text.hidden_size)),
        vocab=int(text.vocab_size),
    )


def memory_plan(
    shape: ModelShape, cfg: TrainConfig, *, device: str = "cuda", gpu_memory_gib: float = 78.0
) -> dict[str, Any]:
    """The plan's terms (bytes and GiB), its peak and whether it fits `gpu_memory_gib`."""
    cuda = device == "cuda"
    p = shape.params
    act = 2 if cuda and cfg.bf16 else 4
    checkpointing = cfg.gradient_checkpointing if cfg.gradient_checkpointing is not None else cuda
    t, h, i = cfg.token_budget, shape.hidden, shape.intermediate
    layer = t * (8 * h + 3 * i) * act
    activations = (shape.layers * t * h * act + layer) if checkpointing else shape.layers * layer
    activations += 2 * min(cfg.logprob_chunk, t) * shape.vocab * 4
    terms = {
        "weights": 4 * p,
        "gradients": 4 * p,
        "optimizer_state": 8 * p,
        "activations": activations,
        "reference_model": ((2 if cuda else 4) * p) if cfg.kl_coef else 0,
        "autocast_weight_copies": 2 * p if act == 2 else 0,
        "optimizer_temporary": 0 if cuda else 4 * p,
    }
    held = terms["weights"] + terms["gradients"] + terms["optimizer_state"] + terms["reference_model"]
    peak = held + max(terms["activations"] + terms["autocast_weight_copies"], terms["optimizer_temporary"])
    dtype = cfg.save_dtype if cfg.save_dtype != "auto" else ("bfloat16" if cuda else "float32")
    weights_on_disk = (2 if dtype == "bfloat16" else 4) * p
    master_on_disk = 4 * p if dtype == "bfloat16" else 0
    return {
        "device": device,
        "params": p,
        "gradient_checkpointing": checkpointing,
        "token_budget": t,
        **{f"{k}_bytes": v for k, v in terms.items()},
        **{f"{k}_gib": round(v / GIB, 2) for k, v in terms.items()},
        "peak_bytes": peak,
        "peak_gib": round(peak / GIB, 2),
        "gpu_memory_gib": gpu_memory_gib,
        "fits": peak / GIB <= gpu_memory_gib,
        "checkpoint_gib": round(weights_on_disk / GIB, 2),
        "checkpoint_with_optimizer_gib": round((weights_on_disk + 8 * p + master_on_disk) / GIB, 2),
        "sync_gib": round(weights_on_disk / GIB, 2),
    }
