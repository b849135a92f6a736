"""GRPO and RLOO advantages from episode rewards and groups, for `polarproxy export --advantages`.

Every row of an episode gets the episode's advantage, computed from the episode rewards of its group:

- `grpo`: (r - mean_g) / (std + 1e-6), where std is the standard deviation of the group's rewards
  (`scale="group"`, the default), of every rewarded episode in the export (`scale="batch"`), or 1 with no
  epsilon (`scale="none"`: r - mean_g, as Dr. GRPO does). The std is the sample one (n - 1, as verl, slime
  and TRL compute it: `torch.std`) unless `std_estimator="population"` (n);
- `rloo`: r - the mean of the group's other episodes' rewards (leave-one-out; no scaling).

Groups: an episode's `group_id`; an episode without one is grouped by its task (several samples of one
task recorded without `--group`), and an episode with neither is a group of its own. The key is written to
each row's `metadata.advantage_group` ('group:ID', 'task:NAME', 'episode:ID').

What is left out, and counted in the summary:
- failed episodes of class `infra` (export/failures.py: the harness never reached the model, or its proxy
  died) are not samples of the policy: they leave their group (`excluded_failed`), unless
  `failed_as_zero`. Failures of class `agent` (a crash after its first answered call, a time limit, a
  verifier timeout) keep their reward, or get 0.0 when they have none, and stay in their group;
- episodes without a reward (not yet rewarded) take no part (their rows are not exported with advantages);
- a group whose rewards are all equal (a group of one included) teaches nothing: its episodes' rows are
  dropped, unless `keep_zero_variance`, when their advantage is 0.0. Per-call rewards do
not enter the advantage; rows carry them in `call_rewards` for trainers that use them. Only the episodes
that pass the export's filters are grouped: a filter on reward changes the groups' statistics.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from polarproxy.choices import ESTIMATORS, REWARD_SCALES, STD_ESTIMATORS, check_choice
from polarproxy.export.failures import failure_class
from polarproxy.store.records import Episode

SCALES = REWARD_SCALES
EPS = 1e-6


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def population_std(xs: Sequence[float]) -> float:
    """sqrt(mean((x - mean)^2)); 0.0 for fewer than two values."""
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / len(xs))


def sample_std(xs: Sequence[float]) -> float:
    """sqrt(sum((x - mean)^2) / (n - 1)), as torch.std; 0.0 for fewer than two values."""
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))


STDS = {"sample": sample_std, "population": population_std}


def grpo_advantages(
    rewards: Sequence[float],
    *,
    scale: str = "group",
    batch_std: float | None = None,
    std_estimator: str = "sample",
) -> list[float]:
    """(r - mean) / (std + EPS) for one group; `scale` 'group' (this group's std, `std_estimator` 'sample'
    or 'population'), 'batch' (`batch_std`, the std over the whole export) or 'none' (r - mean, no
    division)."""
    m = _mean(rewards)
    if scale == "none":
        return [r - m for r in rewards]
    if scale == "batch":
        if batch_std is None:
            raise ValueError("scale 'batch' needs batch_std, the standard deviation over the whole export.")
        std = batch_std
    elif scale == "group":
        std = STDS[std_estimator](rewards)
    else:
        raise ValueError(f"Unknown scale {scale!r}. Must be one of {', '.join(map(repr, SCALES))}.")
    return [(r - m) / (std + EPS) for r in rewards]


def rloo_advantages(rewards: Sequence[float]) -> list[float]:
    """r_i - mean of the other rewards of the group; 0.0 for a group of one (there is no baseline)."""
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    total = math.fsum(rewards)
    return [r - (total - r) / (n - 1) for r in rewards]


def group_key(ep: Episode) -> str:
    """The group an episode's advantage is computed in: its group, else its task, else itself."""
    return group_of(ep.group_id, ep.task, ep.id)


def group_of(group_id: str | None, task: str | None, episode_id: str) -> str:
    """group_key from the three fields (a trajectory carries them without its Episode)."""
    if group_id:
        return f"group:{group_id}"
    if task:
        return f"task:{task}"
    return f"episode:{episode_id}"


@dataclass(slots=True, frozen=True)
class AdvantageOptions:
    """`export --advantages grpo|rloo|none --scale-rewards group|batch|none --std-estimator sample|population
    --keep-zero-variance`. `scale` None means 'group' for grpo (and is the only value rloo and none take)."""

    estimator: str = "none"
    scale: str | None = None
    keep_zero_variance: bool = False
    std_estimator: str = "sample"
    failed_as_zero: bool = (
        False  # keep `infra` failures in their groups (reward or 0.0), as before 2026-12-06
    )

    def __post_init__(self) -> None:
        if self.estimator not in ESTIMATORS:
            raise ValueError(
                f"Unknown --advantages {self.estimator!r}. Must be one of {', '.join(map(repr, ESTIMATORS))}."
            )
        if self.scale is not None and self.scale not in SCALES:
            raise ValueError(
                f"Unknown --scale-rewards {self.scale!r}. Must be one of {', '.join(map(repr, SCALES))}."
            )
        check_choice(self.std_estimator, STD_ESTIMATORS, "--std-estimator")

    @property
    def enabled(self) -> bool:
        return self.estimator != "none"

    @property
    def effective_scale(self) -> str | None:
        return (self.scale or "group") if self.estimator == "grpo" else None


@dataclass(slots=True)
class AdvantageReport:
    """Each kept episode's advantage and group, and what was left out."""

    estimator: str
    scale: str | None
    std_estimator: str = "sample"
    advantages: dict[str, float] = field(default_factory=dict)  # episode ID -> advantage
    groups: dict[str, str] = field(default_factory=dict)  # episode ID -> group key (kept episodes)
    group_count: int = 0  # groups with at least one rewarded episode
    episodes_without_reward: list[str] = field(default_factory=list)
    excluded_failed: list[str] = field(default_factory=list)  # `infra` failures: not samples of the policy
    zeroed_failed: int = 0  # failures that had no reward and count as 0.0
    zero_variance_groups: list[str] = field(default_factory=list)
    zero_variance_episodes: int = 0
    kept_zero_variance: bool = False
    batch_std: float | None = None
    rows_dropped: int = 0  # filled by the export: rows of episodes that got no advantage

    def summary(self) -> dict[str, Any]:
        return {
            "estimator": self.estimator,
            "scale_rewards": self.scale,
            "std_estimator": self.std_estimator,
            "groups": self.group_count,
            "episodes": len(self.advantages),
            "episodes_without_reward": len(self.episodes_without_reward),
            "excluded_failed": len(self.excluded_failed),
            "failed_as_zero": self.zeroed_failed,
            "zero_variance_groups": len(self.zero_variance_groups),
            "zero_variance_episodes": self.zero_variance_episodes,
            "zero_variance_kept": self.kept_zero_variance,
            "batch_std": self.batch_std,
            "rows_dropped": self.rows_dropped,
        }


def compute_advantages(
    episodes: Iterable[Episode], options: AdvantageOptions, answered: Mapping[str, int] | None = None
) -> AdvantageReport:
    """The advantage of every episode that has one under `options` (see the module docstring). `answered`:
    each episode's calls the model answered (`Store.answered_calls`); None: not known, and only
    interrupted episodes are `infra`."""
    if not options.enabled:
        raise ValueError("compute_advantages needs an estimator: 'grpo' or 'rloo'.")
    scale = options.effective_scale
    report = AdvantageReport(
        options.estimator, scale, options.std_estimator, kept_zero_variance=options.keep_zero_variance
    )
    grouped: dict[str, list[Episode]] = {}
    rewards_of: dict[str, float] = {}
    for ep in episodes:
        cls = failure_class(ep, None if answered is None else answered.get(ep.id, 0))
        if cls == "infra" and not options.failed_as_zero:
            report.excluded_failed.append(ep.id)
            continue
        reward = ep.reward if ep.reward is not None and math.isfinite(ep.reward) else None
        if reward is None and cls is not None:
            reward = 0.0  # a failure that got no reward: a sample that solved nothing
            report.zeroed_failed += 1
        if reward is None:
            report.episodes_without_reward.append(ep.id)
            continue
        rewards_of[ep.id] = reward
        grouped.setdefault(group_key(ep), []).append(ep)
    report.group_count = len(grouped)
    if scale == "batch":
        everyone = [rewards_of[ep.id] for eps in grouped.values() for ep in eps]
        report.batch_std = STDS[options.std_estimator](everyone)
    for key in sorted(grouped):
        members = sorted(grouped[key], key=lambda e: e.id)
        rewards = [rewards_of[ep.id] for ep in members]
        if max(rewards) == min(rewards):
            report.zero_variance_groups.append(key)
            report.zero_variance_episodes += len(members)
            if not options.keep_zero_variance:
                continue
            values = [0.0] * len(members)
        elif options.estimator == "grpo":
            values = grpo_advantages(
                rewards,
                scale=scale or "group",
                batch_std=report.batch_std,
                std_estimator=options.std_estimator,
            )
        else:
            values = rloo_advantages(rewards)
        for ep, value in zip(members, values, strict=True):
            report.advantages[ep.id] = value
            report.groups[ep.id] = key
    return report
