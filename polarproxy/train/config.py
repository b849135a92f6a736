"""The trainer's settings (`TrainConfig`) and their checks. No torch here: the CLI validates options with it
before anything heavy is imported."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "episode-token-mean")
IMPORTANCE_LEVELS = ("token", "sequence")
SCHEDULES = ("constant", "linear", "cosine")
FUSED_LOSS = ("auto", "liger", "off")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(slots=True)
class TrainConfig:
    """One training run. `steps` optimizer steps; each step takes `rows_per_step` rows (0: all rows, so a
    step is one pass over the data), split into micro-batches of at most `token_budget` tokens (a longer
    row gets a micro-batch of its own)."""

    steps: int | None = None  # None: one pass over the rows
    lr: float = 1e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    schedule: str = "constant"
    schedule_steps: int | None = None  # horizon of linear/cosine decay (default: the last step of this run)
    min_lr_ratio: float = 0.1
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None
    tis_cap: float | None = None
    loss_agg: str = "token-mean"
    importance_level: str = "token"
    kl_coef: float = 0.0
    ref_model: str | None = None  # default: the starting model
    rows_per_step: int = 0
    token_budget: int = 8192
    logprob_chunk: int = 1024
    gradient_checkpointing: bool = False
    device: str = "auto"
    bf16: bool = True  # autocast to bfloat16 on CUDA; the CPU path stays float32
    fused_loss: str = "auto"
    save_every: int = 0  # 0: save only after the last step
    resume: bool = False
    seed: int = 0
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
        positive = {
            "--token-budget": self.token_budget,
            "--logprob-chunk": self.logprob_chunk,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}.")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"--steps must be >= 1, got {self.steps}.")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            raise ValueError(
                f"--clip-low must be in [0, 1) and --clip-high >= 0, got {self.clip_low} and {self.clip_high}."
            )
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"--dual-clip must be > 1 (e.g. 3.0), got {self.dual_clip}.")
        if self.tis_cap is not None and not self.tis_cap > 0:
            raise ValueError(f"--tis-cap must be > 0 (e.g. 2.0), got {self.tis_cap}.")
        for name, value in {
            "--lr": self.lr,  # 0: a control run whose weights never change
            "--kl-coef": self.kl_coef,
            "--warmup-steps": self.warmup_steps,
            "--rows-per-step": self.rows_per_step,
            "--save-every": self.save_every,
            "--max-grad-norm": self.max_grad_norm,
            "--weight-decay": self.weight_decay,
        }.items():
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}.")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"--min-lr-ratio must be in [0, 1], got {self.min_lr_ratio}.")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
