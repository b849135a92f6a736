"""TRL's GRPOTrainer trained on `export --format trl` rows: a `rollout_func` that answers each prompt with
the next recorded episode of that prompt's group, and the dataset of prompts it answers.

TRL repeats each dataset prompt `num_generations` times and asks the rollout_func for one completion per
entry; here a prompt is a group ID (`group_id` of the rows), so the dataset is one row per group and
`num_generations` the groups' size (the export holds groups of one size). TRL computes its own advantages
from the rewards its reward functions return: `recorded_reward` returns the recorded ones (the rows' `reward`
reaches it as an extra field), and with `scale_rewards="none"` TRL's advantages are polarproxy's
`--advantages grpo --scale-rewards none` (docs/trainers.md). TRL itself is not imported here.

    replay = TrlReplay("episodes.trl.jsonl")
    trainer = GRPOTrainer(model=..., reward_funcs=recorded_reward, rollout_func=replay,
                          train_dataset=Dataset.from_list(replay.dataset()),
                          args=GRPOConfig(num_generations=replay.num_generations, scale_rewards="none", ...))
"""

from __future__ import annotations

import os
from typing import Any

import orjson

from polarproxy.integrations.replay import GroupReplay

KEYS = ("prompt_ids", "completion_ids", "logprobs", "env_mask", "reward", "advantage")


class TrlReplay(GroupReplay):
    """The rows of a `--format trl` file by group, replayed in order (replay.py)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        groups: dict[str, list[dict[str, Any]]] = {}
        with open(path, "rb") as f:
            for line in f:
                if line.strip():
                    row = orjson.loads(line)
                    groups.setdefault(row["group_id"], []).append(row)
        if not groups:
            raise ValueError(f"{path} holds no rows; export some with polarproxy export --format trl.")
        sizes = {len(rows) for rows in groups.values()}
        if len(sizes) != 1:
            raise ValueError(f"{path} holds groups of sizes {sorted(sizes)}; TRL needs one size.")
        super().__init__(groups, "use TrlReplay.dataset()")
        self.num_generations = sizes.pop()

    def dataset(self) -> list[dict[str, str]]:
        """TRL's train dataset: one prompt per group (its ID)."""
        return [{"prompt": group} for group in self.groups]

    def __call__(self, prompts: list[Any], trainer: Any = None) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {key: [] for key in KEYS}
        for prompt in prompts:
            row = self.next(prompt)
            for key in KEYS:
                out[key].append(row[key])
        return out


def recorded_reward(
    prompts: Any = None, completions: Any = None, reward: list[float] | None = None, **_: Any
) -> list[float]:
    """A TRL reward function that returns the recorded reward of each replayed row."""
    if reward is None:
        raise ValueError("no recorded reward reached the reward function: pass TrlReplay as the rollout_func")
    return [float(r) for r in reward]
