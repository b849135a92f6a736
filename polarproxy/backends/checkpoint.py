"""What a checkpoint folder says about itself: the trainer writes `polarproxy.json` beside the weights.

A checkpoint is a model folder written by `save_pretrained` (`OUT/step-N/`); its `polarproxy.json`
holds at least `{"weight_version": "..."}`, the label backends report in every answer once they serve it.
Light: no torch.
"""

from __future__ import annotations

import json
from pathlib import Path

CHECKPOINT_META = "polarproxy.json"


class CheckpointMetaError(ValueError):
    """`polarproxy.json` exists but cannot be read, or its weight_version is not a string."""


def read_weight_version(folder: Path | str) -> str | None:
    """The `weight_version` in `folder/polarproxy.json`; None when the file is absent or names none."""
    path = Path(folder) / CHECKPOINT_META
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CheckpointMetaError(f"Cannot read {path}: {e.strerror}.") from None
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointMetaError(f"{path} is not valid JSON: {e}.") from None
    if not isinstance(meta, dict):
        raise CheckpointMetaError(f"{path} must hold a JSON object, not {type(meta).__name__}.")
    version = meta.get("weight_version")
    if version is None:
        return None
    if not isinstance(version, str) or not version:
        raise CheckpointMetaError(f"weight_version in {path} must be a non-empty string, got {version!r}.")
    return version
