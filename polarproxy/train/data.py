"""Export rows (schemas/export-row.v*.json, JSONL or Parquet files) → training samples. No torch here.

A `Sample` keeps what the loss needs of one row: the token IDs, which of them were sampled (loss mask),
the behaviour logprob of each sampled token and the temperature it is at (the row's per-call
`logprob_temperatures`, export rows v3), the row's advantage, and the episode, group and weight version the
row came from. Advantages come from `polarproxy export --advantages grpo`; a row without one
is an error (there is no silent fallback to raw rewards: a GRPO step on un-baselined rewards is a
different algorithm).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NO_ADVANTAGE_HINT = (
    "Export the rows with advantages: `polarproxy export --advantages grpo ...` (rewards and group IDs are "
    "needed for it)."
)


class DataError(ValueError):
    """Rows the trainer cannot use; the message names the file/row and what to do."""


@dataclass(slots=True)
class Sample:
    """One training sequence. `logprobs[i]` is the behaviour logprob of `input_ids[i]` where `loss_mask[i]`
    is 1 (0.0 elsewhere). `weight_version` is the oldest integer weight version of the row's calls, or None
    when the backend reported none (or a non-integer one, e.g. "default")."""

    input_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    advantage: float
    episode_id: str
    group_id: str | None = None
    reward: float | None = None
    weight_version: int | None = None
    call_ids: list[str] = field(default_factory=list)
    source: str = ""  # "FILE:LINE" for error messages
    # the logprob temperature of each position (empty: 1 everywhere); the trainer scores at it
    temperatures: list[float] = field(default_factory=list)
    # whether some call's logprob temperature is not in the row (rows before v3): trained at the assumed one
    temperature_assumed: bool = False

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def trainable_tokens(self) -> int:
        return sum(self.loss_mask[1:])  # position 0 has no context to predict it from


def read_rows(paths: Sequence[str | os.PathLike[str]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(source, row) for every row of the given JSONL (.jsonl, .json) or Parquet (.parquet) files."""
    import orjson

    for p in paths:
        path = Path(p)
        if not path.is_file():
            raise DataError(f"Data file '{path}' does not exist. Pass files written by `polarproxy export`.")
        if path.suffix == ".parquet":
            from polarproxy.export.parquet import read_parquet_rows

            for i, row in enumerate(read_parquet_rows(path)):
                yield f"{path}:row {i}", row
            continue
        with path.open("rb") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = orjson.loads(line)
                except orjson.JSONDecodeError as e:
                    raise DataError(
                        f"{path}:{n} is not a JSON line ({e}). Pass JSONL or .parquet exports."
                    ) from e
                yield f"{path}:{n}", row


def parse_version(value: Any) -> int | None:
    """An integer weight version ("3" or 3), else None ("default", None)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _row_version(row: dict[str, Any]) -> int | None:
    per_call = row.get("weight_versions")
    if isinstance(per_call, list):
        versions = [v for v in map(parse_version, per_call) if v is not None]
        if versions:
            return min(versions)
    return parse_version(row.get("weight_version"))


ASSUME_TEMPERATURE_HINT = (
    "Export them again with this polarproxy (rows v3 carry logprob_temperatures), or pass "
    "--assume-logprob-temperature T with the temperature their backend's logprobs are at."
)


def _position_temperatures(
    row: dict[str, Any], n: int, where: str, assume: float | None
) -> tuple[list[float], bool]:
    """(the logprob temperature of each of the row's n positions, [] when it is 1 everywhere; whether some
    call's is not in the row and `assume` (default 1) stands in)."""
    per_call = row.get("logprob_temperatures")
    fallback = 1.0 if assume is None else float(assume)
    if not isinstance(per_call, list) or not per_call:
        per_call = [None]
    temps: list[float] = []
    assumed = False
    for t in per_call:
        if t is None:
            assumed = True
            temps.append(fallback)
        elif isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
            raise DataError(f"{where} has logprob temperature {t!r}; it must be a positive number or null.")
        else:
            temps.append(float(t))
    if all(t == 1.0 for t in temps):
        return [], assumed
    if len(set(temps)) == 1:
        return [temps[0]] * n, assumed
    spans = (row.get("metadata") or {}).get("call_output_spans")
    if not isinstance(spans, list) or len(spans) != len(temps):
        raise DataError(
            f"{where} holds calls at different logprob temperatures ({sorted(set(temps))}) without "
            "metadata.call_output_spans saying which tokens each call sampled. Export it with "
            "`polarproxy export`, which writes them."
        )
    out = [1.0] * n
    for span, t in zip(spans, temps, strict=True):
        a, b = int(span[0]), int(span[1])
        out[a:b] = [t] * (b - a)
    return out, assumed


def sample_from_row(
    row: dict[str, Any], source: str = "", *, assume_temperature: float | None = None
) -> Sample:
    """The sample of one export row, its logprobs at the row's `logprob_temperatures` (where the row has
    none, at `assume_temperature`, default 1: `Sample.temperature_assumed`); raises DataError saying what
    is wrong with it."""
    where = source or f"row of episode {row.get('episode_id')}"
    missing = [k for k in ("input_ids", "loss_mask", "logprobs", "episode_id") if k not in row]
    if missing:
        raise DataError(f"{where} lacks {', '.join(missing)}: it is not a polarproxy GRPO export row.")
    advantage = row.get("advantage")
    if advantage is None:
        raise DataError(f"{where} has no 'advantage'. {NO_ADVANTAGE_HINT}")
    if not isinstance(advantage, int | float) or not math.isfinite(advantage):
        raise DataError(f"{where} has advantage {advantage!r}; it must be a finite number.")
    ids, mask, lps = list(row["input_ids"]), list(row["loss_mask"]), list(row["logprobs"])
    if not len(ids) == len(mask) == len(lps):
        raise DataError(
            f"{where} has {len(ids)} input_ids, {len(mask)} loss_mask and {len(lps)} logprobs; they must be equal."
        )
    logprobs = [0.0] * len(ids)
    for i, (m, lp) in enumerate(zip(mask, lps, strict=True)):
        if not m:
            continue
        if lp is None:
            mask[i] = (
                0  # the backend reported no logprob: no ratio can be formed, so the token is not trained
            )
            continue
        logprobs[i] = float(lp)
    if mask:
        mask[0] = 0  # nothing predicts the first token
    temperatures, assumed = _position_temperatures(row, len(ids), where, assume_temperature)
    return Sample(
        input_ids=[int(t) for t in ids],
        loss_mask=[1 if m else 0 for m in mask],
        logprobs=logprobs,
        advantage=float(advantage),
        episode_id=str(row["episode_id"]),
        group_id=row.get("group_id"),
        reward=row.get("reward"),
        weight_version=_row_version(row),
        call_ids=list(row.get("call_ids") or []),
        source=where,
        temperatures=temperatures,
        temperature_assumed=assumed,
    )


def samples_from_rows(
    rows: Iterable[dict[str, Any] | tuple[str, dict[str, Any]]],
    *,
    assume_temperature: float | None = None,
    warn: Callable[[str], None] | None = None,
) -> list[Sample]:
    """Samples of the rows (each a row, or a (source, row) pair as `read_rows` yields); rows with no
    trainable token are dropped. Raises DataError if none is left. Rows whose logprob temperature is not
    known are trained at `assume_temperature` (default 1), with a warning that counts them."""
    out = []
    for item in rows:
        source, row = item if isinstance(item, tuple) else ("", item)
        s = sample_from_row(row, source, assume_temperature=assume_temperature)
        if s.trainable_tokens:
            out.append(s)
    if not out:
        raise DataError("No row has a trainable token (loss_mask 1 with a logprob). Nothing to train on.")
    warn_assumed(out, assume_temperature, warn)
    return out


def warn_assumed(
    samples: Sequence[Sample], assume: float | None, warn: Callable[[str], None] | None = None
) -> None:
    """Warn, counting them, about samples trained at an assumed logprob temperature without
    --assume-logprob-temperature."""
    n = sum(s.temperature_assumed for s in samples)
    if not n or assume is not None:
        return
    message = (
        f"{n} rows do not say which temperature their logprobs are at (export rows before v3); they are "
        f"trained at T = 1. {ASSUME_TEMPERATURE_HINT}"
    )
    if warn is not None:
        warn(message)
    else:
        warnings.warn(message, stacklevel=3)


def load_samples(
    paths: Sequence[str | os.PathLike[str]],
    *,
    warn: Callable[[str], None] | None = None,
    assume_temperature: float | None = None,
) -> list[Sample]:
    """The samples of every row in the files, each call trained once: a row of a later file whose calls
    an earlier file already holds (a per-request and a prefix-merge export of the same episodes) is left
    out, with a warning that counts them. `assume_temperature`: as samples_from_rows'."""
    samples = samples_from_rows(read_rows(paths), assume_temperature=assume_temperature, warn=warn)
    if len(paths) < 2:
        return samples
    seen: set[str] = set()
    kept: list[Sample] = []
    dropped: dict[str, int] = {}
    first_file: dict[str, str] = {}
    for s in samples:
        source = s.source.rsplit(":", 1)[0]
        if s.call_ids and any(c in seen and first_file[c] != source for c in s.call_ids):
            dropped[source] = dropped.get(source, 0) + 1
            continue
        for c in s.call_ids:
            seen.add(c)
            first_file.setdefault(c, source)
        kept.append(s)
    for source, n in dropped.items():
        message = (
            f"{n} rows of {source} hold calls an earlier --data file already has; each call is trained "
            "once (pass one export per set of episodes)."
        )
        if warn is not None:
            warn(message)
        else:
            warnings.warn(message, stacklevel=2)
    if not kept:
        raise DataError("No row is left once each call is taken once.")
    return kept
