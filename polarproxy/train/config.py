"""The trainer's settings (`TrainConfig`) and their checks. No torch here: the CLI validates options with it
before anything heavy is imported."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from polarproxy.choices import DEVICES, FUSED_LOSS, IMPORTANCE_LEVELS, LOSS_AGGS, SAVE_DTYPES, SCHEDULES

LOSS = "Loss"  # the help panels of `polarproxy train`
RUN = "Run"


def option(
    default: Any,
    help: str,
    *,
    panel: str | None = RUN,
    flag: str | None = None,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """A field that is also an option of `polarproxy train`: its default, help, help panel, flag spelling
    (default `--name-with-dashes`) and closed choices (a tuple of polarproxy/choices.py) live here only."""
    return field(default=default, metadata={"help": help, "panel": panel, "flag": flag, "choices": choices})


@dataclass(slots=True)
class TrainConfig:
    """One training run. `steps` optimizer steps; each step takes `rows_per_step` rows (0: all rows, so a
    step is one pass over the data), split into micro-batches of at most `token_budget` tokens (a longer
    row gets a micro-batch of its own). Each field with help is an option of `polarproxy train`, built
    from this declaration (commands/train.py)."""

    steps: int | None = option(None, "Optimizer steps (default: one pass over the rows).", panel=None)
    lr: float = option(1e-6, "Peak learning rate (AdamW).", panel=None)
    clip_low: float = option(0.2, "Lower clip ε: ratio ≥ 1 - ε.", panel=LOSS)
    clip_high: float = option(0.28, "Upper clip ε: ratio ≤ 1 + ε.", panel=LOSS)
    dual_clip: float | None = option(
        None, "Dual clip c > 1: loss ≤ c·|A| for negative advantages.", panel=LOSS
    )
    tis_cap: float | None = option(
        None, "Truncated importance sampling: weight tokens by min(π/π_behaviour, CAP).", panel=LOSS
    )
    loss_agg: str = option("token-mean", "How token losses are averaged.", panel=LOSS, choices=LOSS_AGGS)
    max_completion_length: int | None = option(
        None,
        "dr-grpo's L: the step's loss is its token sum / (rows x L) (TRL's max_completion_length; default: the "
        "most trainable tokens of one row of the step).",
        panel=LOSS,
    )
    importance_level: str = option(
        "token",
        "token, or sequence (GSPO: exp of the mean log-ratio).",
        panel=LOSS,
        choices=IMPORTANCE_LEVELS,
    )
    assume_logprob_temperature: float | None = option(
        None,
        "Temperature of the logprobs of rows that do not say (export rows before v3); default 1, with a warning.",
        panel=LOSS,
    )
    kl_coef: float = option(0.0, "k3 KL penalty to the reference (0: none).", panel=LOSS)
    ref_model: str | None = option(None, "Reference model for --kl-coef (default: --model).", panel=LOSS)
    rows_per_step: int = option(0, "Rows per optimizer step (0: all).")
    token_budget: int = option(8192, "Tokens per packed micro-batch.")
    logprob_chunk: int = option(1024, "Tokens per lm_head chunk.")
    warmup_steps: int = option(0, "Linear warm-up steps.")
    schedule: str = option("constant", "Learning-rate schedule after the warm-up.", choices=SCHEDULES)
    # horizon of linear/cosine decay (default: the last step of this run)
    schedule_steps: int | None = option(None, "Decay horizon in global steps (default: the last step).")
    min_lr_ratio: float = option(0.1, "Decay floor as a share of --lr.")
    weight_decay: float = option(0.0, "AdamW weight decay.")
    max_grad_norm: float = option(1.0, "Gradient clipping norm (0: off).")
    # None: on for CUDA (what fits a 4B model on one 80 GB card: train --plan), off on the CPU
    gradient_checkpointing: bool | None = option(
        None,
        "Recompute activations in backward (default: on for CUDA, off on the CPU).",
        flag="--gradient-checkpointing/--no-gradient-checkpointing",
    )
    device: str = option("auto", "Where to train.", choices=DEVICES)
    # autocast to bfloat16 on CUDA; the CPU path stays float32
    bf16: bool = option(True, "bf16 autocast on CUDA.", flag="--bf16/--no-bf16")
    fused_loss: str = option("auto", "liger: liger-kernel's fused GRPO loss on CUDA.", choices=FUSED_LOSS)
    # every step that saves writes its weights; the optimizer state (8 bytes a parameter) only every N steps
    # and at the end of a run, which is where --resume continues from
    save_every: int = option(
        0, "Save the optimizer state (for --resume) every N steps, and at the end (0: only at the end)."
    )
    # what the backend loads (and `train --sync` pushes): bf16 on CUDA, half the bytes of the float32 master
    # weights, which go with the optimizer state so that --resume continues from them exactly
    save_dtype: str = option(
        "auto",
        "Weights of each checkpoint's model folder: auto = bfloat16 on CUDA, float32 on the CPU; the float32 "
        "master weights are saved with the optimizer state.",
        choices=SAVE_DTYPES,
    )
    keep_last: int = option(
        2, "Checkpoints to keep in --out; the newest one with optimizer state is never deleted."
    )
    resume: bool = option(False, "Continue from the last checkpoint in --out.", panel=None, flag="--resume")
    seed: int = option(0, "Random seed.", panel=None)
    betas: tuple[float, float] = (0.9, 0.999)
    shuffle: bool = True

    def check(self) -> None:
        """Raise ValueError naming the bad value and the allowed ones."""

        def one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
            if value not in allowed:
                raise ValueError(
                    f"Unknown {name} {value!r}. Must be one of " + ", ".join(repr(a) for a in allowed) + "."
                )

        one_of("--loss-agg", self.loss_agg, LOSS_AGGS)
        one_of("--importance-level", self.importance_level, IMPORTANCE_LEVELS)
        one_of("--schedule", self.schedule, SCHEDULES)
        one_of("--fused-loss", self.fused_loss, FUSED_LOSS)
        one_of("--device", self.device, DEVICES)
        one_of("--save-dtype", self.save_dtype, SAVE_DTYPES)
        positive = {
            "--token-budget": self.token_budget,
            "--logprob-chunk": self.logprob_chunk,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}.")
        if self.keep_last < 1:
            raise ValueError(f"--keep-last must be >= 1, got {self.keep_last}.")
        if self.max_completion_length is not None and self.max_completion_length < 1:
            raise ValueError(f"--max-completion-length must be >= 1, got {self.max_completion_length}.")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {self.steps}.")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError(
                f"--clip-low must be in [0, 1) and --clip-high >= 0, got {self.clip_low} and {self.clip_high}."
            )
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"--dual-clip must be > 1 (e.g. 3.0), got {self.dual_clip}.")
        t = self.assume_logprob_temperature
        if t is not None and not (math.isfinite(t) and t > 0):
            raise ValueError(f"--assume-logprob-temperature must be > 0 (e.g. 0.6), got {t}.")
        if self.tis_cap is not None and not self.tis_cap > 0:
            raise ValueError(f"--tis-cap must be > 0 (e.g. 2.0), got {self.tis_cap}.")
        for name, value in {
            "--lr": self.lr,  # 0: a control run whose weights never change
            "--kl-coef": self.kl_coef,
            "--warmup-steps": self.warmup_steps,
            "--rows-per-step": self.rows_per_step,
            "--save-every": self.save_every,
            "--keep-last": self.keep_last,
            "--max-grad-norm": self.max_grad_norm,
            "--weight-decay": self.weight_decay,
        }.items():
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}.")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"--min-lr-ratio must be in [0, 1], got {self.min_lr_ratio}.")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
