"""GRPO training throughput and MFU of polarproxy's trainer on a GPU, with a real-architecture Qwen3 model
built from a config on the device (random weights: nothing is downloaded).

    python bench/train_gpu.py [--size 0.6b|1.7b|4b] [--rows N] [--min-len 256] [--max-len 8192]
                              [--budget TOKENS] [--steps N] [--gradient-checkpointing] [--peak-tflops F]
                              [--attn polarproxy_varlen|sdpa|flash_attention_2] [--json OUT]
    python bench/train_gpu.py --device cpu --tiny        # smoke test of the script itself

Each step is the trainer's own: rows packed by token budget (batching.micro_batches), the decoder under bf16
autocast with float32 master weights, attention per packed sequence (`polarproxy_varlen`, the trainer's
default; --attn sdpa for transformers' block-diagonal mask, flash_attention_2 where flash-attn is
installed), chunked logprobs over the trainable tokens, the GRPO loss, backward, gradient clipping and
AdamW. The rows are a heavy-tailed mix (Pareto, alpha 1.1) of --min-len..--max-len
tokens, half of each trainable.

MFU = achieved model FLOP/s ÷ the device's peak dense bf16 FLOP/s (--peak-tflops; default 989 for an
H100/H200 SXM, null on the CPU). Model FLOPs per step = 6 · (non-embedding parameters) · tokens + the
attention term 12 · layers · heads · head_dim · Σ_seq L²/2 (causal), + 6 · hidden · vocab · trainable
tokens for the lm_head (only trainable tokens are scored). Recomputation (gradient checkpointing, the
chunked lm_head) is not counted, as usual for MFU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from polarproxy.train.attention import VARLEN, use_packed_attention  # noqa: E402  (no torch at import)

SIZES: dict[str, dict[str, int]] = {  # Qwen3 shapes (https://huggingface.co/Qwen configs)
    "tiny": {"hidden": 64, "layers": 2, "heads": 2, "kv_heads": 1, "head_dim": 32, "ffn": 192, "vocab": 1024},
    "0.6b": {
        "hidden": 1024,
        "layers": 28,
        "heads": 16,
        "kv_heads": 8,
        "head_dim": 128,
        "ffn": 3072,
        "vocab": 151936,
    },
    "1.7b": {
        "hidden": 2048,
        "layers": 28,
        "heads": 16,
        "kv_heads": 8,
        "head_dim": 128,
        "ffn": 6144,
        "vocab": 151936,
    },
    "4b": {
        "hidden": 2560,
        "layers": 36,
        "heads": 32,
        "kv_heads": 8,
        "head_dim": 128,
        "ffn": 9728,
        "vocab": 151936,
    },
}
DEFAULT_PEAK_TFLOPS = 989.0  # H100/H200 SXM dense bf16


def build(cfg: dict[str, int], device: Any, attn: str) -> Any:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=cfg["vocab"],
        hidden_size=cfg["hidden"],
        intermediate_size=cfg["ffn"],
        num_hidden_layers=cfg["layers"],
        num_attention_heads=cfg["heads"],
        num_key_value_heads=cfg["kv_heads"],
        head_dim=cfg["head_dim"],
        max_position_embeddings=65536,
        tie_word_embeddings=cfg["hidden"] <= 1024,
        attn_implementation="sdpa" if attn == VARLEN else attn,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(config)
    model.to(torch.float32)
    model.config.use_cache = False
    if attn == VARLEN:
        use_packed_attention(model)  # as the trainer's load_model does
    return model.train()


def model_flops(cfg: dict[str, int], model: Any, lengths: list[int], trainable: int) -> float:
    emb = cfg["vocab"] * cfg["hidden"]
    params = sum(p.numel() for p in model.parameters())
    non_embedding = params - emb * (1 if model.config.tie_word_embeddings else 2)
    tokens = sum(lengths)
    attn = 12 * cfg["layers"] * cfg["heads"] * cfg["head_dim"] * sum(n * n / 2 for n in lengths)
    return 6 * non_embedding * tokens + attn + 6 * cfg["hidden"] * cfg["vocab"] * trainable


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="the tiny shape and short rows (smoke test)")
    p.add_argument("--size", choices=sorted(SIZES), default="0.6b")
    p.add_argument("--rows", type=int)
    p.add_argument("--min-len", type=int)
    p.add_argument("--max-len", type=int)
    p.add_argument("--budget", type=int)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--attn", default=VARLEN)
    p.add_argument("--peak-tflops", type=float)
    p.add_argument("--json", type=Path)
    args = p.parse_args()

    import torch

    from polarproxy.train.batching import micro_batches
    from polarproxy.train.logprobs import batch_logprobs
    from polarproxy.train.loss import LossSettings, grpo_loss

    sys.path.insert(0, str(REPO / "bench"))
    from train_step import heavy_tailed_samples

    size = "tiny" if args.tiny else args.size
    cfg = SIZES[size]
    rows = args.rows or (8 if args.tiny else 64)
    lo = args.min_len or (16 if args.tiny else 256)
    hi = args.max_len or (128 if args.tiny else 8192)
    budget = args.budget or (256 if args.tiny else 16384)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    peak = args.peak_tflops if args.peak_tflops else (DEFAULT_PEAK_TFLOPS if cuda else None)

    model = build(cfg, device, args.attn)
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    samples = heavy_tailed_samples(rows, lo, hi, cfg["vocab"])
    batches = [
        mb.to(device) for mb in micro_batches(samples, list(range(len(samples))), "token-mean", budget)
    ]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=cuda)
    settings = LossSettings()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for mb in batches:
            with autocast:
                logp, _ = batch_logprobs(model, mb, chunk=2048)
                ones = torch.ones_like(logp)
                loss, _ = grpo_loss(
                    logp, mb.behaviour_logp, mb.advantages, ones, mb.weights, mb.seq_index, mb.n_seq, settings
                )
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        return total

    step()  # warm-up
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    seconds = sorted(times)[len(times) // 2]
    lengths = [len(s) for s in samples]
    trainable = sum(s.trainable_tokens for s in samples)
    flops = model_flops(cfg, model, lengths, trainable)
    result = {
        "device": torch.cuda.get_device_name(device) if cuda else "cpu",
        "size": size,
        "params": sum(p.numel() for p in model.parameters()),
        "rows": rows,
        "lengths": [lo, hi],
        "tokens_per_step": sum(lengths),
        "trainable_tokens_per_step": trainable,
        "micro_batches": len(batches),
        "budget": budget,
        "gradient_checkpointing": args.gradient_checkpointing,
        "attn": args.attn,
        "seconds_per_step": seconds,
        "tokens_per_s": sum(lengths) / seconds,
        "model_tflops_per_s": flops / seconds / 1e12,
        "peak_tflops": peak,
        "mfu": flops / seconds / (peak * 1e12) if peak else None,
        "peak_memory_gb": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else None,
        "loss": loss,
    }
    for k, v in result.items():
        print(f"{k:>26}: {v}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
