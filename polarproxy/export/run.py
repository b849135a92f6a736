"""`polarproxy export` as one library call: options checked, filters applied, advantages computed, rows written.

The CLI parses flags and calls `run_export`; everything an export does is here, the same for every format:
the filters (export/filters.py) choose the episodes and calls, the advantages (export/advantages.py) are
computed over the episodes that pass, and each format writes the rows.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from polarproxy.choices import EXPORT_FORMATS, TOKEN_FORMATS, TRAINER_FORMATS
from polarproxy.errors import UsageError
from polarproxy.export import parallel
from polarproxy.export.advantages import AdvantageOptions, AdvantageReport, compute_advantages
from polarproxy.export.filters import ExportFilters
from polarproxy.export.rows import ExportStats
from polarproxy.reconstruct.trajectory import SpanTrajectory, Trajectory

FORMATS = EXPORT_FORMATS
DEFAULT_STRATEGY = "per-request"
TRAINER_STRATEGY = "prefix-merge"  # a trainer format's default: an agent loop is one sequence
SLIME_TEMPLATE = "{rollout_id}"


def default_strategy(fmt: str) -> str:
    """The strategy a format uses when --strategy is not given."""
    return TRAINER_STRATEGY if fmt in TRAINER_FORMATS else DEFAULT_STRATEGY


def default_estimator(fmt: str) -> str:
    """The advantages a format gets when --advantages is not given: grpo for the trainer formats (their
    trainers read polarproxy's advantages), none for polarproxy's own rows."""
    return "grpo" if fmt in TRAINER_FORMATS else "none"


class OptionError(UsageError):
    """An option that does not apply to the format or the other options given (a usage error: exit 2)."""


def check_options(
    fmt: str,
    *,
    strategy: str | None = None,
    include_failed: bool = False,
    tokenizer: object | None = None,
    encoding: str | None = None,
    advantages: AdvantageOptions | None = None,
) -> None:
    """Refuse options that would be silently ignored (OptionError), before anything is read."""
    adv = advantages or AdvantageOptions(default_estimator(fmt) if fmt in FORMATS else "none")
    if fmt not in FORMATS:
        raise OptionError(
            f"Unknown --format {fmt!r}. Must be one of {', '.join(map(repr, FORMATS))}.",
            hint="jsonl or parquet: token rows; sft: chat messages; slime, verl, trl, nemo-rl, openrlhf: "
            "each trainer's own rows (docs/trainers.md).",
        )
    if fmt != "sft":
        given = [flag for flag, v in (("--tokenizer", tokenizer), ("--encoding", encoding)) if v is not None]
        if given:
            raise OptionError(
                f"{' and '.join(given)} go with --format sft, not --format {fmt}.",
                hint=f"Token rows carry the sampled IDs already: drop {' and '.join(given)}, or pass --format sft.",
            )
    else:
        given = [
            flag
            for flag, on in (("--strategy", strategy is not None), ("--include-failed", include_failed))
            if on
        ]
        given += [
            flag
            for flag, on in (
                ("--advantages", adv.enabled),
                ("--scale-rewards", adv.scale is not None),
                ("--keep-zero-variance", adv.keep_zero_variance),
            )
            if on
        ]
        if given:
            raise OptionError(
                f"{', '.join(given)} do not apply to --format sft (chat messages of complete calls).",
                hint="Drop them, or export token rows with --format jsonl or --format parquet.",
            )
    if not adv.enabled and (adv.scale is not None or adv.keep_zero_variance):
        flags = [
            f
            for f, on in (
                ("--scale-rewards", adv.scale is not None),
                ("--keep-zero-variance", adv.keep_zero_variance),
            )
            if on
        ]
        raise OptionError(
            f"{' and '.join(flags)} go with --advantages grpo or rloo.",
            hint="Add --advantages grpo (or rloo), or drop them.",
        )
    if adv.estimator == "rloo" and adv.scale is not None:
        raise OptionError(
            f"--scale-rewards {adv.scale} goes with --advantages grpo; rloo is r minus the mean of the others, unscaled.",
            hint="Drop --scale-rewards, or pass --advantages grpo.",
        )


def resolve_episodes(store: Any, episodes: Sequence[str] | None) -> list[str] | None:
    """Episode IDs for `--episode` values (IDs or unique prefixes); UsageError for one that matches none."""
    if not episodes:
        return None
    from polarproxy.store.errors import StoreError

    try:
        return [store.get_episode(e).id for e in episodes]
    except StoreError as e:
        raise UsageError(str(e), hint="List episodes with `polarproxy ls`.") from e


def trajectories(
    calls: Iterable[Any],
    episodes: dict[str, Any],
    strategy: str,
    *,
    include_failed: bool = False,
    report: AdvantageReport | None = None,
) -> Iterable[Trajectory | SpanTrajectory]:
    """`calls` (store Calls or token calls, by episode) reconstructed by `strategy`, each row carrying its
    episode's advantage when `report` has one (rows of episodes without one are dropped and counted): the
    trajectories `run_export` writes and the control API's pulls return."""
    from polarproxy.reconstruct import get_strategy

    trajs = get_strategy(strategy)(calls, episodes=episodes, include_failed=include_failed)
    return _with_advantages(trajs, report) if report is not None else trajs


def _with_advantages(
    trajs: Iterable[Trajectory | SpanTrajectory], report: AdvantageReport
) -> Iterator[Trajectory | SpanTrajectory]:
    for traj in trajs:
        value = report.advantages.get(traj.episode_id)
        if value is None:
            report.rows_dropped += 1
            continue
        traj.advantage = value
        traj.metadata["advantage_group"] = report.groups[traj.episode_id]
        yield traj


def run_export(
    store: Any,
    out: str | os.PathLike[str],
    *,
    fmt: str = "jsonl",
    strategy: str | None = None,
    filters: ExportFilters | None = None,
    advantages: AdvantageOptions | None = None,
    episodes: Sequence[str] | None = None,
    include_failed: bool = False,
    tokenizer: str | os.PathLike[str] | None = None,
    encoding: str | None = None,
    plain: bool = False,
    jobs: int = 1,
    groups_per_file: int | None = None,
) -> dict[str, Any]:
    """Export the store to `out` in `fmt`; return the summary `polarproxy export --json` prints.

    `jobs` > 1 writes token rows from that many processes into the same file, the same rows in the same
    order (export/parallel.py); the summary's `jobs` says how many ran.

    Token rows are built from the store's token arrays (store/token_calls.py: no Python object per token);
    `plain` builds them from `Store.iter_calls`' Call objects and list trajectories instead, the reference
    the array path is tested against (tests/export/test_export_fast_path.py). Both write the same rows.

    `episodes` are IDs or unique prefixes (`--episode`), added to `filters`. Raises OptionError for options
    that do not apply (exit 2), UsageError for values that name nothing, ValueError for a row that cannot be
    written (the old `out` is then left as it was).

    A trainer format (slime, verl, trl, nemo-rl, openrlhf) defaults to --strategy prefix-merge and
    --advantages grpo; `groups_per_file` is slime's groups per step file (`out` holding `{rollout_id}`)."""
    adv = advantages or AdvantageOptions(default_estimator(fmt) if fmt in FORMATS else "none")
    check_options(
        fmt,
        strategy=strategy,
        include_failed=include_failed,
        tokenizer=tokenizer,
        encoding=encoding,
        advantages=adv,
    )
    if jobs < 1:
        raise OptionError(f"--jobs {jobs} is not a number of processes.", hint="Pass --jobs 1 or more.")
    if fmt not in TOKEN_FORMATS and jobs > 1:
        raise OptionError(
            f"--jobs goes with --format jsonl or parquet (token rows), not --format {fmt}.",
            hint="Drop --jobs.",
        )
    if groups_per_file is not None:
        if fmt != "slime" or SLIME_TEMPLATE not in str(out):
            raise OptionError(
                "--groups-per-file goes with --format slime and an --out that holds {rollout_id} (one file "
                "per training step, slime's --load-debug-rollout-data template).",
                hint="e.g. --format slime --out 'steps/{rollout_id}.pt' --groups-per-file 8",
            )
        if groups_per_file < 1:
            raise OptionError(
                f"--groups-per-file {groups_per_file} is not a number of groups.", hint="Pass 1 or more."
            )
    filters = filters or ExportFilters()
    ids = resolve_episodes(store, episodes)
    if ids is not None:
        from dataclasses import replace

        filters = replace(filters, episode_ids=ids)
    if fmt == "sft":
        from polarproxy.export.sft import export_sft

        sft = export_sft(store, out, filters=filters, tokenizer=tokenizer, encoding=encoding)
        summary: dict[str, Any] = {"out": str(out), "format": "sft", **sft.summary()}
        if tokenizer is not None or encoding is not None:
            summary["retokenized"] = str(tokenizer or encoding)
        if sft.skipped:
            summary["skipped_reasons"] = sft.skipped[:20]
        summary["filters"] = filters.describe()
        return summary

    from polarproxy.export.writers import get_writer
    from polarproxy.reconstruct import get_strategy

    strategy = strategy or default_strategy(fmt)
    try:
        get_strategy(strategy)  # an unknown strategy fails here, before anything is read
    except ValueError as e:
        raise OptionError(str(e), hint="Use --strategy per-request or --strategy prefix-merge.") from None
    query = filters.query()
    chosen = {e.id: e for e in store.list_episodes(limit=None, where=query, counts=False)}
    report = None
    if adv.enabled:
        report = compute_advantages(chosen.values(), adv, store.answered_calls(list(chosen)))

    def rows(source_store: Any, episode_ids: list[str] | None) -> Iterable[Trajectory | SpanTrajectory]:
        if plain:  # prefix-merge reads most prompts only by length: rebuild their ID lists only when read
            source: Iterable[Any] = store.iter_calls(where=query, lazy_prompts=strategy == "prefix-merge")
        else:
            from polarproxy.store.token_calls import iter_token_calls

            source = iter_token_calls(source_store, episode_ids, where=query)
        return trajectories(
            filters.calls(source), chosen, strategy, include_failed=include_failed, report=report
        )

    if fmt in TRAINER_FORMATS:
        from polarproxy.export.advantages import group_key
        from polarproxy.export.trainers import TrainerOptions, get_trainer_writer

        if report is not None:
            sizes = Counter(report.groups[eid] for eid in report.advantages)
        else:
            sizes = Counter(group_key(ep) for ep in chosen.values())
        options = TrainerOptions(groups_per_file=groups_per_file or 1, group_sizes=sizes)
        stats = get_trainer_writer(fmt)(rows(store, None), out, options)
        return _summary(out, strategy, fmt, stats, chosen, 1, filters, report)
    write = get_writer(fmt)
    parts: list[list[str]] = []
    if jobs > 1 and not plain and parallel.why_not_parallel(store) is None:
        from polarproxy.store.token_calls import episode_calls

        parts = parallel.split(episode_calls(store, where=query), jobs)
    if len(parts) <= 1:
        stats = write(rows(store, None), out)
    else:
        stats = _write_in_parts(store, out, write, rows, parts, report)
    return _summary(out, strategy, fmt, stats, chosen, max(1, len(parts)), filters, report)


def _summary(
    out: str | os.PathLike[str],
    strategy: str,
    fmt: str,
    stats: ExportStats,
    chosen: dict[str, Any],
    jobs: int,
    filters: ExportFilters,
    report: AdvantageReport | None,
) -> dict[str, Any]:
    return {
        "out": str(out),
        "strategy": strategy,
        "format": fmt,
        **stats.summary(),
        "episodes": len(chosen),
        "jobs": jobs,
        "filters": filters.describe(),
        "advantages": None if report is None else report.summary(),
    }


def _write_in_parts(
    store: Any,
    out: str | os.PathLike[str],
    write: Any,
    rows: Callable[[Any, list[str] | None], Iterable[Trajectory | SpanTrajectory]],
    parts: list[list[str]],
    report: AdvantageReport | None,
) -> ExportStats:
    """The first part written here, the others by forked workers (export/parallel.py) and appended."""
    from polarproxy.store.store import Store

    def work(episode_ids: list[str], path: str) -> tuple[ExportStats, int]:
        own = Store.open(store.connect_url)  # a connection of this process's own, never the parent's
        try:
            part_stats = write(rows(own, episode_ids), path, durable=False)  # synced once appended
        finally:
            own.close()
        return part_stats, report.rows_dropped if report is not None else 0

    workers = parallel.Workers(out, parts[1:], work)
    workers.start(store)  # before this process writes anything, so no thread of its own is forked
    done: list[tuple[str, ExportStats, int]] = []
    try:

        def appended() -> list[str]:
            done.extend(workers.results())
            return [path for path, _, _ in done]

        stats = write(rows(store, parts[0]), out, append=appended)
    finally:
        workers.close()
    for _, part_stats, dropped in done:
        stats.merge(part_stats)
        if report is not None:
            report.rows_dropped += dropped
    return stats
