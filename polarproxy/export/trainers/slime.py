"""`--format slime`: slime's `Sample` dicts saved with `torch.save` as `{"rollout_id": N, "samples": [...]}`,
the file slime's `--load-debug-rollout-data PATH --debug-train-only` trains on (docs/trainers.md).

Each sample: `tokens` (prompt + response), `response_length`, `loss_mask` and `rollout_log_probs` (one per
response token; the logprob 0.0 where the mask is 0), `reward`, `status` (`completed`, `truncated`,
`aborted` or `failed`), `weight_versions`, `rollout_id` (the trajectory's episode, numbered from 0 in the
export and shared by its branches), `group_index` (its group, numbered from 0), `index` (the sample's own
number) and `metadata` (the advantage polarproxy computed, and polarproxy's own fields).

When `out` holds `{rollout_id}`, slime's path template, each file holds one training step of
`groups_per_file` complete groups, numbered from 0; a group is written once all of its episodes have been
read, so memory holds the groups not yet complete, not the export. Files are written under temporary names
and renamed only once all of them are complete. torch is imported here alone (`pip install
'polarproxy[torch]'`). The samples are pickled by Python's C pickler, their token lists from numpy arrays
(`_Pickled`, `_AsList`): `torch.load(..., weights_only=False)`, as slime loads, gives back plain lists of
ints and floats (numpy must be importable there, as it is wherever torch is).
"""

from __future__ import annotations

import operator
import os
import pickle
import tempfile
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from polarproxy.export.atomic import new_file_mode, sync_folder
from polarproxy.export.rows import ExportStats
from polarproxy.export.trainer_rows import TrainerRow, TrainerRowError, one_temperature, row_extras
from polarproxy.export.trainers import TrainerOptions, by_episode, trainer_rows
from polarproxy.reconstruct.trajectory import SpanTrajectory, Trajectory

TEMPLATE = "{rollout_id}"
ABORTED = {"aborted", "interrupted", "cancelled"}


def status(row: TrainerRow) -> str:
    """slime's Sample.Status of the row's last call."""
    call_status = row.traj.metadata.get("call_status")
    if call_status == "failed":
        return "failed"
    if call_status in ABORTED or row.traj.finish_reason in ABORTED:
        return "aborted"
    if row.traj.finish_reason == "length":
        return "truncated"
    return "completed"


def slime_sample(row: TrainerRow, *, rollout_id: int, group_index: int, index: int) -> dict[str, Any]:
    p = row.prompt_len
    return {
        "tokens": _AsList(row.ids),
        "response_length": len(row.ids) - p,
        "loss_mask": _AsList(row.mask(p)),
        "rollout_log_probs": _AsList(row.logprobs[p:]),  # float32: tolist() widens each value exactly
        "reward": row.traj.reward,
        "status": status(row),
        "weight_versions": [v for v in row.traj.weight_versions if v is not None],
        "rollout_id": rollout_id,
        "group_index": group_index,
        "index": index,
        "metadata": {"advantage": row.traj.advantage, "polarproxy": row_extras(row)},
    }


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise TrainerRowError(
            "--format slime writes torch.save files and needs torch, which is not installed. Install it "
            "with: pip install 'polarproxy[torch]'"
        ) from None
    return torch


class _AsList:
    """A numpy array that unpickles as the list of its values (`array.tolist()`, by
    `operator.methodcaller`, a builtin): the file holds plain lists, as slime's Samples do, without
    building millions of Python ints here first."""

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return (operator.methodcaller("tolist"), (self.array,))


class _Pickled:
    """`samples` pickled by the C pickler, and restored by `torch.load` as the list itself: torch.save's
    own pickler calls back into Python for every object, 12x slower on lists of ints than pickle.dumps;
    unpickled, this is `pickle.loads(bytes)`, a builtin (torch.load with weights_only=False, as slime
    loads, runs it), so the loaded file holds plain lists of ints and floats, as slime's own dumps do."""

    def __init__(self, value: Any) -> None:
        # protocol 5, not HIGHEST_PROTOCOL: the trainer's Python may be older than this one
        self.payload = pickle.dumps(value, protocol=5)

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return (pickle.loads, (self.payload,))


class _Files:
    """Step files written under temporary names in their folder (with the mode a new file gets), each
    synced to disk in a background thread while the next one is built, and renamed together at the end."""

    def __init__(self, template: str) -> None:
        self.template = template
        self.staged: list[tuple[str, Path]] = []
        self._syncs = ThreadPoolExecutor(max_workers=1, thread_name_prefix="slime-sync")
        self._pending: list[Future[None]] = []

    def save(self, torch: Any, step: int, samples: list[dict[str, Any]]) -> None:
        final = Path(self.template.replace(TEMPLATE, str(step)))
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
        self.staged.append((tmp, final))
        os.fchmod(fd, new_file_mode())
        f = os.fdopen(fd, "wb")
        try:
            # torch.save's default protocol, 2, pickles bytes as latin-1 text (`_codecs.encode`): a pass
            # over every byte, and two for each one over 0x7f; protocol 5 writes them as they are
            torch.save({"rollout_id": step, "samples": _Pickled(samples)}, f, pickle_protocol=5)
            f.flush()
        except BaseException:
            f.close()
            raise
        self._pending.append(self._syncs.submit(_sync_and_close, f))

    def _wait(self) -> None:
        for future in self._pending:
            future.result()
        self._pending.clear()

    def commit(self) -> list[str]:
        self._wait()
        self._syncs.shutdown()
        for tmp, final in self.staged:
            os.replace(tmp, final)
        for folder in {final.parent for _, final in self.staged}:
            sync_folder(folder)
        return [str(final) for _, final in self.staged]

    def discard(self) -> None:
        for future in self._pending:
            future.exception()  # wait: the file must not be removed under its sync
        self._syncs.shutdown()
        for tmp, _ in self.staged:
            Path(tmp).unlink(missing_ok=True)


def _sync_and_close(f: Any) -> None:
    try:
        os.fsync(f.fileno())
    finally:
        f.close()


def write_slime(
    trajectories: Iterable[Trajectory | SpanTrajectory], out: str | os.PathLike[str], options: TrainerOptions
) -> ExportStats:
    torch = _torch()
    template = str(out) if TEMPLATE in str(out) else None
    if template is not None:
        folder = Path(template.replace(TEMPLATE, "0")).parent
        if not folder.is_dir():
            raise TrainerRowError(
                f"The folder of --out '{out}' does not exist. Create it first (mkdir -p {folder})."
            )
    files = _Files(template or str(out))
    stats = ExportStats()
    temperatures: Counter[float | None] = Counter()
    episodes: dict[str, int] = {}
    groups: dict[str, int] = {}
    waiting: dict[str, list[dict[str, Any]]] = {}  # group -> samples, until the group is complete
    seen: Counter[str] = Counter()  # group -> episodes read
    step: list[dict[str, Any]] = []
    step_groups = 0
    index = 0
    try:
        for rows in by_episode(trainer_rows(trajectories, stats)):
            rollout_id = episodes.setdefault(rows[0].traj.episode_id, len(episodes))
            for row in rows:
                temperatures.update(row.traj.logprob_temperatures or [None] * len(row.spans))
                one_temperature(temperatures, "slime")
                group_index = groups.setdefault(row.group, len(groups))
                sample = slime_sample(row, rollout_id=rollout_id, group_index=group_index, index=index)
                waiting.setdefault(row.group, []).append(sample)
                index += 1
            if template is None or options.group_sizes is None:
                continue
            group = rows[0].group
            seen[group] += 1
            expected = options.group_sizes.get(group)  # a group it does not know completes at the end
            if expected is not None and seen[group] >= expected:
                step += waiting.pop(group)
                step_groups += 1
                if step_groups == options.groups_per_file:
                    files.save(torch, options.first_step + len(files.staged), step)
                    step, step_groups = [], 0
        for samples in waiting.values():  # groups that completed only at the end, in order of appearance
            step += samples
            step_groups += 1
            if template is not None and step_groups == options.groups_per_file:
                files.save(torch, options.first_step + len(files.staged), step)
                step, step_groups = [], 0
        if step or not files.staged:
            files.save(torch, options.first_step + len(files.staged), step)
        stats.files = files.commit()
    except BaseException:
        files.discard()
        raise
    return stats
