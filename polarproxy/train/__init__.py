"""GRPO training on export rows: pure loss functions, packing, chunked logprobs, the loop, checkpoints.

`train(rows, model_dir, out_dir, TrainConfig(...)) -> TrainResult` is the library entry point (the RL demo
calls it in-process per iteration); `polarproxy train` is the command. torch is imported only inside this
package, and only when a function that needs it runs: importing `polarproxy.train` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from polarproxy.train.config import TrainConfig
from polarproxy.train.data import DataError, Sample, load_samples, samples_from_rows

if TYPE_CHECKING:
    from polarproxy.train.loop import TrainError, TrainResult, train

__all__ = [
    "DataError",
    "Sample",
    "TrainConfig",
    "TrainError",
    "TrainResult",
    "load_samples",
    "samples_from_rows",
    "train",
]


def __getattr__(name: str) -> Any:
    if name in ("train", "TrainResult", "TrainError"):
        from polarproxy.train import loop

        return getattr(loop, name)
    raise AttributeError(name)
