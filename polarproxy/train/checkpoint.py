"""Checkpoints: OUT/step-N/ is a model folder (save_pretrained weights + config, the tokenizer files and chat
template of the model it started from) that `polarproxy backend --model` and `record` load, plus
polarproxy.json (its weight version, an increasing integer as a string) and, where the run saved it,
trainer_state.pt (the optimizer state, for `--resume`, which continues from the newest checkpoint that has
one). A checkpoint is written to a temporary folder and renamed into place, so a crash never leaves a
half-written step-N that `--resume` would pick. Its folder is group-readable (0750, files 0640), so a
backend that runs as another user of the group can load it; `prune` keeps the newest `keep_last` and the
newest with optimizer state.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

META = "polarproxy.json"
TRAINER_STATE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step-(\d+)$")
# Files of a model folder that save_pretrained rewrites (everything else, e.g. the tokenizer, is copied).
_WEIGHT_FILES = re.compile(
    r"^(config\.json|generation_config\.json|.*\.safetensors|.*\.bin|.*\.safetensors\.index\.json"
    r"|.*\.bin\.index\.json|.*\.pt|" + re.escape(META) + r")$"
)


def read_version(model_dir: str | os.PathLike[str]) -> int:
    """The integer weight version of a model folder (its polarproxy.json), 0 for a folder the trainer did
    not write."""
    path = Path(model_dir) / META
    try:
        meta = json.loads(path.read_text())
        return int(meta["weight_version"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def checkpoints(out_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(step, folder) of every complete checkpoint in `out_dir`, oldest first."""
    out = Path(out_dir)
    if not out.is_dir():
        return []
    found = []
    for p in out.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / META).is_file() and (p / "config.json").is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(out_dir: str | os.PathLike[str]) -> tuple[int, Path] | None:
    found = checkpoints(out_dir)
    return found[-1] if found else None


def resume_checkpoint(out_dir: str | os.PathLike[str]) -> tuple[int, Path] | None:
    """Where `--resume` continues: the newest checkpoint with optimizer state, else the newest."""
    found = checkpoints(out_dir)
    with_state = [c for c in found if (c[1] / TRAINER_STATE).is_file()]
    return (with_state or found or [None])[-1]


def prune(out_dir: str | os.PathLike[str], keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints and the newest one with optimizer state; the
    deleted folders."""
    found = checkpoints(out_dir)
    keep = {p for _, p in found[-keep_last:]}
    resumable = resume_checkpoint(out_dir)
    if resumable is not None:
        keep.add(resumable[1])
    gone = [p for _, p in found if p not in keep]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


def _readable_by_group(folder: Path) -> None:
    folder.chmod(0o750)
    for p in folder.rglob("*"):
        p.chmod(0o750 if p.is_dir() else 0o640)


def save_checkpoint(
    model: Any,
    source_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    step: int,
    *,
    optimizer: Any = None,
    meta: dict[str, Any] | None = None,
    weights_dtype: Any = None,
) -> Path:
    """Write OUT/step-{step}/ (weight version str(step)) and return it; replaces an existing one.
    `weights_dtype` (a torch dtype): the model folder's weights in it (bf16: what the backend loads, half
    the bytes); the model's own weights then also go with the optimizer state (`master_weights`), so that
    --resume continues from them rather than from the cast."""
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    final = out / f"step-{step}"
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=f".step-{step}-"))
    cast = weights_dtype is not None and any(p.dtype != weights_dtype for p in model.parameters())
    try:
        if cast:
            state = {
                k: v.to(weights_dtype) if v.is_floating_point() else v for k, v in model.state_dict().items()
            }
            model.save_pretrained(tmp, state_dict=state, safe_serialization=True)
            del state
        else:
            model.save_pretrained(tmp, safe_serialization=True)
        source = Path(source_dir)
        for p in sorted(source.iterdir()):
            if p.is_file() and not _WEIGHT_FILES.match(p.name) and not (tmp / p.name).exists():
                shutil.copy2(p, tmp / p.name)
        if optimizer is not None:
            trainer_state: dict[str, Any] = {"optimizer": optimizer.state_dict(), "step": step}
            if cast:
                trainer_state["master_weights"] = model.state_dict()
            torch.save(trainer_state, tmp / TRAINER_STATE)
        info = {"weight_version": str(step), "step": step, "saved_at": time.time(), **(meta or {})}
        (tmp / META).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        _readable_by_group(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def load_trainer_state(checkpoint_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The optimizer state saved with a checkpoint, or None."""
    import torch

    path = Path(checkpoint_dir) / TRAINER_STATE
    if not path.is_file():
        return None
    return torch.load(path, map_location="cpu", weights_only=True)
