"""Rewards: verifier commands run after a harness, and the reward they give (see verifier.py)."""

from __future__ import annotations

from polarproxy.rewards.verifier import (
    DEFAULT_TIMEOUT_S,
    REWARD_FROM,
    RewardParseError,
    Verifier,
    VerifierResult,
    parse_reward_output,
    run_verifier,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "REWARD_FROM",
    "RewardParseError",
    "Verifier",
    "VerifierResult",
    "parse_reward_output",
    "run_verifier",
]
