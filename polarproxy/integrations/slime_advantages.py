"""slime trained with polarproxy's advantages on `export --format slime` files.

slime groups rewards by their position in the batch (`n_samples_per_prompt` consecutive samples), not by
`group_index`, and normalises them itself; a branched episode (several samples) or groups of several sizes
would put samples in the wrong group. `reward_post_process` is a `--custom-reward-post-process-path`
function that keeps the recorded rewards as slime's raw rewards and hands slime's GRPO estimator the
advantage polarproxy computed for each sample (its `metadata["advantage"]`), which that estimator broadcasts
over the sample's response tokens:

    --load-debug-rollout-data 'steps/{rollout_id}.pt' --advantage-estimator grpo
    --custom-reward-post-process-path polarproxy.integrations.slime_advantages.reward_post_process

Read from slime's source (docs/trainers.md names the commit); slime does not install here, so this was not
run against it. slime is not imported.
"""

from __future__ import annotations

from typing import Any


def _metadata(sample: Any) -> dict[str, Any]:
    return sample["metadata"] if isinstance(sample, dict) else sample.metadata


def _reward(sample: Any) -> Any:
    return sample["reward"] if isinstance(sample, dict) else sample.reward


def reward_post_process(args: Any, samples: list[Any]) -> tuple[list[float], list[float]]:
    """(raw rewards, rewards): the recorded rewards, and polarproxy's advantage per sample. ValueError for a
    sample exported without one (`export --advantages none`)."""
    raw = [float(_reward(s) or 0.0) for s in samples]
    advantages = []
    for i, s in enumerate(samples):
        advantage = _metadata(s).get("advantage")
        if advantage is None:
            raise ValueError(
                f"sample {i} has no polarproxy advantage; export with --advantages grpo (the default for "
                "--format slime), or let slime normalise rewards itself"
            )
        advantages.append(float(advantage))
    return raw, advantages
