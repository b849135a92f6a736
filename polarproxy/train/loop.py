"""The training loop: export rows → GRPO steps → checkpoints OUT/step-N/ and OUT/metrics.jsonl.

    result = train(rows, model_dir, out_dir, TrainConfig(steps=1, lr=1e-6))
    result.checkpoint, result.weight_version   # OUT/step-N, "N"

Each optimizer step takes a set of rows (`plan_steps`), packs them into micro-batches by token budget
(`batching`), runs the decoder once per micro-batch, scores only the trainable tokens chunk-wise
(`logprobs`), accumulates the gradient of each micro-batch's share of the step loss (`loss`), clips the
gradient norm and takes one AdamW step at the scheduled learning rate. Version numbers: a model folder
the trainer did not write is version 0; the checkpoint after global step N is version N (so the step
directory, the `step` metric and the weight version agree, and `--resume` continues the count).

Left out: several PPO epochs or mini-batches per rollout batch (one update per row set: the clip is
against the behaviour logprobs), data/tensor/pipeline parallelism and FSDP (one device), LoRA, mixed
precision beyond bf16 autocast (master weights and AdamW state stay float32), a data cursor across
`--resume` (each run plans its own rows), and generation (rows come from `polarproxy export`).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polarproxy.train.attention import use_packed_attention
from polarproxy.train.config import TrainConfig
from polarproxy.train.data import Sample, samples_from_rows
from polarproxy.train.layout import choose_layout

log = logging.getLogger("polarproxy.train")


class TrainError(RuntimeError):
    """A run that cannot start or go on; the message says what to do."""


@dataclass
class TrainResult:
    """What a run produced: the last checkpoint folder and its weight version, the global step it reached,
    how many steps this run took, and each step's metrics."""

    checkpoint: Path
    weight_version: str
    step: int
    steps_run: int
    metrics: list[dict[str, Any]] = field(default_factory=list)


def lr_at(step: int, cfg: TrainConfig, horizon: int) -> float:
    """Learning rate of global step `step` (1-based): linear warm-up over `warmup_steps`, then constant,
    or a linear / cosine decay to lr * min_lr_ratio at `horizon`."""
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    if cfg.schedule == "constant":
        return cfg.lr
    span = max(1, horizon - cfg.warmup_steps)
    progress = min(1.0, max(0.0, (step - cfg.warmup_steps) / span))
    shape = 1.0 - progress if cfg.schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape)


def _device(cfg: TrainConfig) -> Any:
    import torch

    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise TrainError("--device cuda was asked for, but torch sees no CUDA device. Pass --device cpu.")
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def checkpointing(cfg: TrainConfig, device_type: str) -> bool:
    """Whether activations are recomputed in backward: `--gradient-checkpointing`, by default on CUDA."""
    return cfg.gradient_checkpointing if cfg.gradient_checkpointing is not None else device_type == "cuda"


def load_model(
    model_dir: str | os.PathLike[str], device: Any, *, trainable: bool = True, dtype: Any = None
) -> Any:
    """The model in fp32 (the trainer's master weights), or `dtype` for a model that only scores."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype or torch.float32)
    except (OSError, ValueError) as e:
        raise TrainError(f"Cannot load a model from '{model_dir}': {e}") from e
    model.to(device)
    model.config.use_cache = False
    use_packed_attention(model)  # packed rows cost their sequences' attention, not the whole row's
    if trainable:
        model.train()
    else:
        model.eval().requires_grad_(False)
    return model


def _staleness(samples: Sequence[Sample], trained_version: int) -> tuple[float | None, int | None]:
    ages = [trained_version - s.weight_version for s in samples if s.weight_version is not None]
    if not ages:
        return None, None
    return sum(ages) / len(ages), max(ages)


class Trainer:
    """A model, its optimizer and its loss settings, ready to take optimizer steps: `train` runs a plan of
    steps with it, and `polarproxy train --follow` (follow.py) one step per batch as rows land. Starts from
    `model_dir` (or, with cfg.resume, from the last checkpoint in `out_dir`). `step` is the global step
    reached, which is also the weight version of the current weights; `saved` the last checkpoint folder
    (`model_dir` before any)."""

    def __init__(
        self, model_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], cfg: TrainConfig
    ) -> None:
        import torch

        from polarproxy.train import checkpoint as ckpt
        from polarproxy.train.logprobs import decoder_and_head
        from polarproxy.train.loss import LossSettings
        from polarproxy.train.metrics import MetricsLog

        cfg.check()
        self.cfg = cfg
        self.out = out = Path(out_dir)
        self.device = device = _device(cfg)
        torch.manual_seed(cfg.seed)

        latest = ckpt.latest_checkpoint(out)
        if latest and cfg.resume:
            latest = ckpt.resume_checkpoint(out)  # the newest with optimizer state
        if latest and not cfg.resume:
            raise TrainError(
                f"'{out}' already holds checkpoints up to step-{latest[0]}. Pass --resume to continue from "
                "it, or a new --out folder."
            )
        self.start_dir = latest[1] if latest else Path(model_dir)
        self.step = latest[0] if latest else ckpt.read_version(model_dir)
        self.model = model = load_model(self.start_dir, device)
        if checkpointing(cfg, device.type):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.ref_model = None
        if cfg.kl_coef:  # on CUDA in bf16: it only scores (half the memory of fp32)
            ref_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
            self.ref_model = load_model(cfg.ref_model or model_dir, device, trainable=False, dtype=ref_dtype)
        self.layout = choose_layout(model, self.ref_model)
        if self.layout != "packed":
            log.warning(
                "Packed rows are not exact for %s (a layer carries state across the sequences of a row, "
                "e.g. linear attention): training on length-sorted padded micro-batches instead.",
                type(model).__name__,
            )
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=cfg.lr,
            betas=cfg.betas,
            weight_decay=cfg.weight_decay,
            fused=device.type == "cuda",  # one kernel per step, no foreach temporary the size of the weights
        )
        if latest:
            state = ckpt.load_trainer_state(latest[1])
            if state is not None:
                if "master_weights" in state:  # the folder's weights are a cast (--save-dtype)
                    model.load_state_dict(state["master_weights"])
                self.optimizer.load_state_dict(state["optimizer"])
        self.settings = LossSettings(
            clip_low=cfg.clip_low,
            clip_high=cfg.clip_high,
            dual_clip=cfg.dual_clip,
            tis_cap=cfg.tis_cap,
            importance_level=cfg.importance_level,
            kl_coef=cfg.kl_coef,
        )
        self.fused = _fused_loss(cfg, device)
        self.metrics_log = MetricsLog(out)
        _decoder, self.head = decoder_and_head(model)
        self.saved = latest[1] if latest else Path(model_dir)
        self.meta = {
            "base_model": str(Path(model_dir).resolve()),
            "config": cfg.to_json(),
            "micro_batch_layout": self.layout,
        }

    def run_step(self, samples: Sequence[Sample], step_rows: Sequence[int], horizon: int) -> dict[str, Any]:
        """One optimizer step on `samples[i] for i in step_rows` (global step `self.step + 1`, learning rate
        of the schedule ending at `horizon`); advances `self.step` and returns the step's metrics. Neither
        saves nor writes the metrics (`save`, `metrics_log`)."""
        import torch

        from polarproxy.train.batching import micro_batches
        from polarproxy.train.logprobs import batch_logprobs, hidden_states
        from polarproxy.train.loss import grpo_loss

        cfg, device, model, ref_model, fused = self.cfg, self.device, self.model, self.ref_model, self.fused
        optimizer, settings, head = self.optimizer, self.settings, self.head
        autocast = torch.autocast(
            device.type, dtype=torch.bfloat16, enabled=device.type == "cuda" and cfg.bf16
        )
        step = self.step + 1
        t0 = time.perf_counter()
        lr = lr_at(step, cfg, horizon)
        for g in optimizer.param_groups:
            g["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        sums = {"loss": 0.0, "tokens": 0.0, "ratio_sum": 0.0, "ratio_max": 0.0, "clipped": 0.0, "kl_sum": 0.0}
        sums |= {"tis_capped": 0.0, "entropy_sum": 0.0, "run_tokens": 0}
        batches = micro_batches(
            samples,
            step_rows,
            cfg.loss_agg,
            cfg.token_budget,
            layout=self.layout,
            max_completion_length=cfg.max_completion_length,
        )
        for mb in batches:
            mb = mb.to(device)
            with autocast:
                ref_logp = None
                if ref_model is not None:
                    with torch.no_grad():
                        ref_logp, _ = batch_logprobs(ref_model, mb, chunk=cfg.logprob_chunk)
                if fused is not None and fused.ready(ref_logp) and mb.inv_temp is None:
                    hidden = hidden_states(model, mb)[mb.hidden_index]
                    loss, stats, entropy = fused(hidden, head, mb, settings)
                else:
                    logp, entropy = batch_logprobs(model, mb, chunk=cfg.logprob_chunk)
                    mask = torch.ones_like(logp)
                    loss, stats = grpo_loss(
                        logp, mb.behaviour_logp, mb.advantages, mask, mb.weights, mb.seq_index, mb.n_seq,
                        settings, ref_logp,
                    )  # fmt: skip
            loss.backward()
            sums["loss"] += float(loss.detach())
            for key in ("tokens", "ratio_sum", "clipped", "kl_sum", "tis_capped"):
                sums[key] += float(stats[key])
            sums["ratio_max"] = max(sums["ratio_max"], float(stats["ratio_max"]))
            sums["entropy_sum"] += float(entropy.sum())
            sums["run_tokens"] += mb.tokens
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else float("inf")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, max_norm))
        if math.isfinite(grad_norm):
            optimizer.step()
        else:
            log.warning("step %d: gradient norm is %s; the update was skipped", step, grad_norm)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        self.step = step

        chosen = [samples[i] for i in step_rows]
        staleness, staleness_max = _staleness(chosen, step - 1)
        rewards = [s.reward for s in chosen if s.reward is not None]
        n = max(sums["tokens"], 1.0)
        return {
            "step": step,
            "loss": sums["loss"],
            "clip_frac": sums["clipped"] / n,
            "ratio_mean": sums["ratio_sum"] / n,
            "ratio_max": sums["ratio_max"],
            "kl": sums["kl_sum"] / n if ref_model is not None else None,
            "entropy": sums["entropy_sum"] / n,
            "grad_norm": grad_norm,
            "tokens_per_s": sums["run_tokens"] / seconds if seconds > 0 else None,
            "reward_mean": sum(rewards) / len(rewards) if rewards else None,
            "staleness": staleness,
            "weight_version": str(step),
            "lr": lr,
            "rows": len(chosen),
            "tokens": sums["run_tokens"],
            "trainable_tokens": int(sums["tokens"]),
            "micro_batches": len(batches),
            "seconds": seconds,
            "staleness_max": staleness_max,
            "tis_capped_frac": sums["tis_capped"] / n if cfg.tis_cap is not None else None,
            "advantage_mean": sum(s.advantage for s in chosen) / len(chosen),
        }

    def save(self, extra_meta: dict[str, Any] | None = None, *, optimizer_state: bool = True) -> Path:
        """Write OUT/step-{self.step}/ (weights, polarproxy.json with `extra_meta`, and with `optimizer_state`
        the optimizer's), then keep only the newest `keep_last` checkpoints and the newest resumable one."""
        from polarproxy.train import checkpoint as ckpt

        meta = self.meta | (extra_meta or {})
        optimizer = self.optimizer if optimizer_state else None
        self.saved = ckpt.save_checkpoint(
            self.model,
            self.start_dir,
            self.out,
            self.step,
            optimizer=optimizer,
            meta=meta,
            weights_dtype=save_dtype(self.cfg, self.device.type),
        )
        ckpt.prune(self.out, self.cfg.keep_last)
        return self.saved


def save_dtype(cfg: TrainConfig, device_type: str) -> Any:
    """The torch dtype of a checkpoint's model weights (`--save-dtype`; auto: bfloat16 on CUDA)."""
    import torch

    choice = (
        cfg.save_dtype if cfg.save_dtype != "auto" else ("bfloat16" if device_type == "cuda" else "float32")
    )
    return torch.bfloat16 if choice == "bfloat16" else torch.float32


def train(
    rows: Iterable[dict[str, Any]] | Sequence[Sample],
    model_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    cfg: TrainConfig | None = None,
    *,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> TrainResult:
    """Train on export rows (dicts, or `Sample`s) starting from `model_dir` (or, with cfg.resume, from the
    last checkpoint in `out_dir`); write checkpoints and metrics under `out_dir`. `progress(metrics)` is
    called after each step. Raises DataError (bad rows) or TrainError (bad setup)."""
    from polarproxy.train.batching import plan_steps

    cfg = cfg or TrainConfig()
    cfg.check()
    rows = list(rows)
    samples = (
        rows
        if rows and isinstance(rows[0], Sample)
        else samples_from_rows(rows, assume_temperature=cfg.assume_logprob_temperature)  # type: ignore[arg-type]
    )
    trainer = Trainer(model_dir, out_dir, cfg)
    start_step = trainer.step
    plan = plan_steps(samples, cfg.rows_per_step, cfg.steps, seed=cfg.seed + start_step, shuffle=cfg.shuffle)
    last_step = start_step + len(plan)
    horizon = cfg.schedule_steps or last_step
    history: list[dict[str, Any]] = []
    for step_rows in plan:
        m = trainer.run_step(samples, step_rows, horizon)  # type: ignore[arg-type]
        step = trainer.step
        if step == last_step or (cfg.save_every and step % cfg.save_every == 0):
            trainer.save()
        trainer.metrics_log.write(m)
        history.append(m)
        if progress is not None:
            progress(m)
    return TrainResult(
        checkpoint=trainer.saved,
        weight_version=str(last_step),
        step=last_step,
        steps_run=len(plan),
        metrics=history,
    )


class _FusedLoss:
    """liger's fused loss behind a one-time check against the plain loss on the first micro-batch."""

    def __init__(self, cfg: TrainConfig) -> None:
        from polarproxy.train.liger import LigerLoss

        self.liger = LigerLoss(cfg)
        self.cfg = cfg
        self.checked = False
        self.broken = False

    def ready(self, ref_logp: Any) -> bool:
        return not self.broken and ref_logp is None

    def __call__(self, hidden: Any, head: Any, mb: Any, settings: Any) -> tuple[Any, dict[str, Any], Any]:
        import torch

        from polarproxy.train.logprobs import chunked_logprobs
        from polarproxy.train.loss import grpo_loss

        bias = getattr(head, "bias", None)
        with torch.no_grad():  # metrics (and the check) from the plain path, without a graph
            logp, entropy = chunked_logprobs(
                hidden.detach(), head.weight, mb.targets, chunk=self.cfg.logprob_chunk, bias=bias
            )
            mask = torch.ones_like(logp)
            plain, stats = grpo_loss(
                logp, mb.behaviour_logp, mb.advantages, mask, mb.weights, mb.seq_index, mb.n_seq, settings
            )
        try:
            loss = self.liger(hidden, head, mb)
        except Exception as e:  # a liger release with another signature
            log.warning("liger fused GRPO loss failed (%s); using the plain loss", e)
            self.broken = True
            return self._plain(hidden, head, mb, settings)
        if not self.checked:
            self.checked = True
            if not torch.allclose(loss.detach().float(), plain.float(), rtol=1e-2, atol=1e-4):
                log.warning("liger loss %s != plain loss %s; using the plain loss", float(loss), float(plain))
                self.broken = True
                return self._plain(hidden, head, mb, settings)
        return loss, stats, entropy

    def _plain(self, hidden: Any, head: Any, mb: Any, settings: Any) -> tuple[Any, dict[str, Any], Any]:
        import torch

        from polarproxy.train.logprobs import chunked_logprobs
        from polarproxy.train.loss import grpo_loss

        logp, entropy = chunked_logprobs(
            hidden, head.weight, mb.targets, chunk=self.cfg.logprob_chunk, bias=getattr(head, "bias", None)
        )
        mask = torch.ones_like(logp)
        loss, stats = grpo_loss(
            logp, mb.behaviour_logp, mb.advantages, mask, mb.weights, mb.seq_index, mb.n_seq, settings
        )
        return loss, stats, entropy


def _fused_loss(cfg: TrainConfig, device: Any) -> _FusedLoss | None:
    from polarproxy.train import liger

    if not liger.fits(cfg, device):
        if cfg.fused_loss == "liger":
            raise TrainError(
                "--fused-loss liger needs CUDA, liger-kernel (`pip install liger-kernel`), --loss-agg "
                "token-mean and no --dual-clip, --tis-cap or --kl-coef. Pass --fused-loss auto or off."
            )
        return None
    try:
        return _FusedLoss(cfg)
    except Exception as e:
        log.warning("liger fused GRPO loss unavailable (%s); using the plain loss", e)
        return None
