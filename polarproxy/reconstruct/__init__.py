"""Reconstruction: stored calls → trajectories, by strategy."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from polarproxy.reconstruct.per_request import per_request
from polarproxy.reconstruct.prefix_merge import prefix_merge
from polarproxy.reconstruct.trajectory import Trajectory, assert_round_trip

STRATEGIES: dict[str, Callable[..., Iterator[Trajectory]]] = {
    "per-request": per_request,
    "prefix-merge": prefix_merge,
}


def get_strategy(name: str) -> Callable[..., Iterator[Trajectory]]:
    """The reconstruction function registered under `name`."""
    try:
        return STRATEGIES[name]
    except KeyError:
        allowed = ", ".join(repr(s) for s in STRATEGIES)
        raise ValueError(f"Unknown strategy {name!r}. Must be one of {allowed}.") from None


def reconstruct(strategy: str, calls: Any, **options: Any) -> Iterator[Trajectory]:
    """The trajectories of `calls` under the strategy named `strategy` (options: episodes, include_failed)."""
    return get_strategy(strategy)(calls, **options)


__all__ = [
    "STRATEGIES",
    "Trajectory",
    "assert_round_trip",
    "get_strategy",
    "per_request",
    "prefix_merge",
    "reconstruct",
]
