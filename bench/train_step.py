"""Training-step throughput: packed vs padded micro-batches, and per-request vs prefix-merge rows.

    python bench/train_step.py [--quick] [--rows N] [--min-len 64] [--max-len 2048] [--budget TOKENS]
                               [--steps N] [--json OUT]

Model: a Qwen3-architecture model built from a config with random weights (default hidden 256, 4 layers,
vocab 8192; --quick: hidden 64, 2 layers, vocab 1024), float32 on the CPU. Lengths are scaled down for
the CPU: the rows are a heavy-tailed mix (Pareto, alpha 1.1) of 64..2048 tokens (--quick: 16..256), half
of each row trainable, one advantage per row.

Part 1, the same rows three ways, each a full optimizer step (forward, chunked logprobs, GRPO loss,
backward, AdamW) with the same token budget per micro-batch:
  packed         polarproxy's layout: rows end to end, position_ids restarting, no padding, attention
                 per sequence (`polarproxy.train.attention`, as the trainer runs it);
  padded         rows in data order, right-padded to the longest row of the micro-batch (padding counts
                 against the budget), the usual collator;
  padded-sorted  the same after sorting by length (length bucketing: less padding, the usual remedy; the
                 trainer's layout for models whose packed rows are not exact, e.g. Qwen3.5's linear
                 attention);
  trl            TRL's path on the padded batches: full logits, `selective_log_softmax`, its clipped loss
                 (only if `trl` imports; otherwise skipped, and the reason is printed).
Figures: real (non-padding) tokens per second, tokens the model ran over, seconds per step, and the peak
RSS growth during the steps (VmHWM after resetting it through /proc/self/clear_refs), each in a fresh
child process. Target: packed >= 2x padded.

Part 2, the ablation: the same synthetic agent episodes (--calls calls each, default 20; every call's
prompt is the previous prompt + its output + a tool result) exported both ways, in the layout
`polarproxy export` writes: per-request (one row per call: its whole prompt masked, its output trainable)
and prefix-merge (one row per episode: every output trainable, the rest masked). One packed training step
over each: trainer wall time and tokens processed per episode, same trainable tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TARGET_SPEEDUP = 2.0
LAYOUTS = ("packed", "padded", "padded-sorted", "trl")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def model_config(quick: bool) -> dict[str, int]:
    if quick:
        return {
            "hidden": 64,
            "layers": 2,
            "heads": 2,
            "kv_heads": 1,
            "head_dim": 32,
            "ffn": 192,
            "vocab": 1024,
        }
    return {"hidden": 256, "layers": 4, "heads": 4, "kv_heads": 2, "head_dim": 64, "ffn": 768, "vocab": 8192}


def build_model(cfg: dict[str, int], seed: int = 0) -> Any:
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
        tie_word_embeddings=True,
    )
    from polarproxy.train.attention import use_packed_attention

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.config.use_cache = False
    use_packed_attention(model)  # as the trainer's load_model does (padded rows keep sdpa's masked path)
    return model.train()


# -- rows -----------------------------------------------------------------------------------------------


def heavy_tailed_samples(n: int, lo: int, hi: int, vocab: int, seed: int = 0) -> list[Any]:
    from polarproxy.train.data import Sample

    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = min(hi, int(lo * rng.paretovariate(1.1)))
        prompt = length // 2
        ids = [rng.randrange(vocab) for _ in range(length)]
        mask = [0] * prompt + [1] * (length - prompt)
        lps = [-rng.random() * 4 if m else 0.0 for m in mask]
        adv = rng.choice((-1.0, 1.0)) * rng.random()
        out.append(Sample(ids, mask, lps, adv, episode_id=f"ep_{i}", group_id=f"grp_{i // 4}"))
    return out


def episode_samples(
    strategy: str, episodes: int, calls: int, growth: int, vocab: int, seed: int = 0
) -> list[Any]:
    """Agent episodes: call k's prompt = call k-1's prompt + output + a tool result; outputs growth//4."""
    from polarproxy.train.data import Sample

    rng = random.Random(seed)
    out_len = max(1, growth // 4)
    rows = []
    for e in range(episodes):
        ids: list[int] = []
        mask: list[int] = []
        adv = rng.choice((-1.0, 1.0))
        for _k in range(calls):
            ids += [rng.randrange(vocab) for _ in range(growth - out_len)]  # system/user/tool tokens
            mask += [0] * (growth - out_len)
            if strategy == "per-request":  # this call's row: its whole prompt masked, its output trainable
                row_ids = ids + [rng.randrange(vocab) for _ in range(out_len)]
                row_mask = [0] * len(ids) + [1] * out_len
                rows.append(
                    Sample(row_ids, row_mask, [-1.0 * m for m in row_mask], adv, episode_id=f"ep_{e}")
                )
                ids, mask = list(row_ids), [0] * len(row_ids)
            else:
                ids += [rng.randrange(vocab) for _ in range(out_len)]
                mask += [1] * out_len
        if strategy == "prefix-merge":
            rows.append(Sample(ids, mask, [-1.0 * m for m in mask], adv, episode_id=f"ep_{e}"))
    return rows


# -- micro-batches ----------------------------------------------------------------------------------------


def make_batches(samples: list[Any], layout: str, budget: int) -> list[Any]:
    """packed and padded-sorted: the trainer's two layouts (`micro_batches`); padded: in data order."""
    from polarproxy.train.batching import micro_batches, padded_batch, padded_groups, step_weights

    step = list(range(len(samples)))
    if layout in ("packed", "padded-sorted"):
        return micro_batches(samples, step, "token-mean", budget, layout=layout.removesuffix("-sorted"))
    weights = step_weights(samples, "token-mean")
    lengths = [len(s) for s in samples]
    return [padded_batch(samples, g, weights, pad_id=0) for g in padded_groups(lengths, budget, step)]


# -- one step ---------------------------------------------------------------------------------------------


def _trl_loss(model: Any, mb: Any, settings: Any) -> Any:
    """TRL's computation path on a padded micro-batch: full logits, selective_log_softmax, clipped loss."""
    import torch
    from trl.trainer.utils import selective_log_softmax

    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False).logits
    logits = logits[:, :-1].float()
    targets = mb.input_ids[:, 1:]
    logps = selective_log_softmax(logits, targets).reshape(-1)  # (B*(T-1),)
    t = mb.input_ids.shape[1]
    # MicroBatch.hidden_index is into (B*T); position p predicts p+1, which is index p in the (B, T-1) view
    idx = mb.hidden_index // t * (t - 1) + mb.hidden_index % t
    logp = logps[idx]
    ratio = torch.exp(logp - mb.behaviour_logp)
    clipped = torch.clamp(ratio, 1 - settings.clip_low, 1 + settings.clip_high)
    per_token = -torch.min(ratio * mb.advantages, clipped * mb.advantages)
    return (per_token * mb.weights).sum()


def run_steps(model: Any, batches: list[Any], steps: int, layout: str) -> dict[str, Any]:
    import torch

    from polarproxy.train.logprobs import batch_logprobs
    from polarproxy.train.loss import LossSettings, grpo_loss

    settings = LossSettings()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for mb in batches:
            if layout == "trl":
                loss = _trl_loss(model, mb, settings)
            else:
                logp, _ = batch_logprobs(model, mb, chunk=1024)
                ones = torch.ones_like(logp)
                loss, _ = grpo_loss(
                    logp, mb.behaviour_logp, mb.advantages, ones, mb.weights, mb.seq_index, mb.n_seq, settings
                )
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return total

    step()  # warm-up (allocator, kernels)
    rss0 = _reset_peak_rss()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    peak = _peak_rss_mb()
    seconds = sorted(times)[len(times) // 2]
    return {
        "seconds_per_step": seconds,
        "loss": loss,
        "peak_rss_growth_mb": None if rss0 is None else peak - rss0,
    }


def _status_kb(key: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> float | None:
    """Reset VmHWM to the current RSS (Linux clear_refs 5); the RSS in MB, or None where unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    rss = _status_kb("VmRSS")
    return rss / 1024 if rss is not None else None


def _peak_rss_mb() -> float:
    hwm = _status_kb("VmHWM")
    if hwm is not None:
        return hwm / 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- worker and driver ------------------------------------------------------------------------------------


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    cfg = model_config(args.quick)
    kind = args.worker
    if kind in ("per-request", "prefix-merge"):
        samples = episode_samples(kind, args.episodes, args.calls, args.growth, cfg["vocab"])
        layout = "packed"
    else:
        samples = heavy_tailed_samples(args.rows, args.min_len, args.max_len, cfg["vocab"])
        layout = kind
    if layout == "trl":
        import trl  # noqa: F401  (ImportError → the driver reports the column as skipped)

    batches = make_batches(samples, "padded" if layout == "trl" else layout, args.budget)
    model = build_model(cfg)
    r = run_steps(model, batches, args.steps, layout)
    real = sum(len(s) for s in samples)
    ran = sum(mb.tokens for mb in batches)
    r |= {
        "layout": kind,
        "rows": len(samples),
        "micro_batches": len(batches),
        "real_tokens": real,
        "tokens_run": ran,
        "padding_share": 1 - real / ran,
        "trainable_tokens": sum(s.trainable_tokens for s in samples),
        "tokens_per_s": real / r["seconds_per_step"],
    }
    if kind in ("per-request", "prefix-merge"):
        r["episodes"] = args.episodes
        r["tokens_per_episode"] = ran / args.episodes
        r["seconds_per_episode"] = r["seconds_per_step"] / args.episodes
    return r


def _child(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", kind, *args.passthrough]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        if kind == "trl" and "No module named 'trl'" in proc.stderr:
            return {
                "layout": kind,
                "skipped": "trl is not installed here (pip install trl to add the column)",
            }
        raise RuntimeError(f"{kind} worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small model and short rows (the smoke test)")
    p.add_argument("--rows", type=int)
    p.add_argument("--min-len", type=int)
    p.add_argument("--max-len", type=int)
    p.add_argument("--budget", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--episodes", type=int)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--growth", type=int)
    p.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--json", type=Path)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    defaults = (
        {"rows": 16, "min_len": 16, "max_len": 256, "budget": 512, "steps": 1, "episodes": 2, "growth": 16}
        if args.quick
        else {
            "rows": 32,
            "min_len": 64,
            "max_len": 2048,
            "budget": 4096,
            "steps": 3,
            "episodes": 4,
            "growth": 48,
        }
    )
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.worker:
        print(json.dumps(worker(args)))
        return
    args.passthrough = [
        *(["--quick"] if args.quick else []),
        *("--rows", str(args.rows), "--min-len", str(args.min_len), "--max-len", str(args.max_len)),
        *("--budget", str(args.budget), "--steps", str(args.steps), "--episodes", str(args.episodes)),
        *("--calls", str(args.calls), "--growth", str(args.growth), "--threads", str(args.threads)),
    ]
    cfg = model_config(args.quick)
    log(f"model {cfg}; {args.rows} rows of {args.min_len}..{args.max_len} tokens; budget {args.budget}")
    layouts = {}
    for kind in LAYOUTS:
        log(f"  {kind} ...")
        layouts[kind] = _child(args, kind)
    ablation = {}
    for kind in ("per-request", "prefix-merge"):
        log(f"  ablation {kind} ...")
        ablation[kind] = _child(args, kind)

    print(
        f"\nTraining step, {args.rows} rows of {args.min_len}..{args.max_len} tokens (heavy-tailed), budget {args.budget}"
    )
    print(f"{'layout':<15}{'tokens/s':>12}{'tokens run':>12}{'padding':>9}{'s/step':>9}{'peak +MB':>10}")
    for kind, r in layouts.items():
        if "skipped" in r:
            print(f"{kind:<15}  skipped: {r['skipped']}")
            continue
        growth = r["peak_rss_growth_mb"]
        print(
            f"{kind:<15}{r['tokens_per_s']:>12,.0f}{r['tokens_run']:>12,}{r['padding_share']:>9.0%}"
            f"{r['seconds_per_step']:>9.3f}{'-' if growth is None else format(growth, '.0f'):>10}"
        )
    speedup = layouts["packed"]["tokens_per_s"] / layouts["padded"]["tokens_per_s"]
    sorted_speedup = layouts["packed"]["tokens_per_s"] / layouts["padded-sorted"]["tokens_per_s"]
    print(
        f"packed / padded: {speedup:.2f}x (target >= {TARGET_SPEEDUP}x); packed / padded-sorted: {sorted_speedup:.2f}x"
    )
    pr, pm = ablation["per-request"], ablation["prefix-merge"]
    print(f"\nAblation: {args.episodes} episodes x {args.calls} calls, one packed step over each export")
    print(f"{'strategy':<15}{'rows':>7}{'tokens/episode':>16}{'s/episode':>11}{'trainable':>11}")
    for kind, r in ablation.items():
        print(
            f"{kind:<15}{r['rows']:>7}{r['tokens_per_episode']:>16,.0f}{r['seconds_per_episode']:>11.3f}{r['trainable_tokens']:>11,}"
        )
    token_ratio = pr["tokens_per_episode"] / pm["tokens_per_episode"]
    time_ratio = pr["seconds_per_episode"] / pm["seconds_per_episode"]
    print(f"per-request / prefix-merge: {token_ratio:.1f}x tokens, {time_ratio:.1f}x trainer time")
    result = {
        "model": cfg,
        "rows": args.rows,
        "lengths": [args.min_len, args.max_len],
        "budget": args.budget,
        "threads": args.threads,
        "layouts": layouts,
        "packed_over_padded": speedup,
        "packed_over_padded_sorted": sorted_speedup,
        "target_packed_over_padded": TARGET_SPEEDUP,
        "ablation": {"calls": args.calls, "episodes": args.episodes, **ablation},
        "per_request_over_prefix_merge_tokens": token_ratio,
        "per_request_over_prefix_merge_seconds": time_ratio,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
