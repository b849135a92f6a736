"""The trajectory stream: export rows of the episodes finished since an opaque cursor, whole groups with
their advantages when asked. The only code of the control API that reads exports."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from polarproxy.store import keys
from polarproxy.store.query import EpisodeQuery

if TYPE_CHECKING:
    from polarproxy.store.store import Store


def encode_cursor(seq: int) -> str:
    return base64.urlsafe_b64encode(f"f{seq}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> int:
    """The finish `seq` a cursor stands for (0: from the start); ValueError for a cursor this API did not give."""
    if not cursor:
        return 0
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not raw.startswith("f"):
            raise ValueError
        seq = int(raw[1:])
        if seq < 0:
            raise ValueError
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise ValueError(
            f"Unknown cursor {cursor!r}: pass back the 'cursor' of the previous answer, or none to start "
            "from the first finished episode."
        ) from None
    return seq


def collect(
    store: Store,
    after: int,
    *,
    strategy: str,
    whole_groups: bool,
    estimator: str,
    limit: int,
    std_estimator: str = "sample",
) -> tuple[list[dict[str, Any]], int, int]:
    """The export rows of the episodes finished after finish `seq` `after` (up to `limit` finishes), and the
    new cursor `seq`, and how many episodes left their groups as `infra` failures (export/failures.py). With
    `whole_groups`, a group's rows come with its last finish, once it is complete."""
    finishes = keys.finishes_after(store, after, limit=limit)
    if not finishes:
        return [], after, 0
    cursor = finishes[-1][0]
    if not whole_groups:
        eps = store.list_episodes(
            limit=None, where=EpisodeQuery(episode_ids=[e for _, e in finishes]), counts=False
        )
        order = {eid: i for i, (_, eid) in enumerate(finishes)}
        rows, _ = _rows(store, sorted(eps, key=lambda e: order[e.id]), strategy, "none", std_estimator)
        return rows, cursor, 0
    rows: list[dict[str, Any]] = []
    excluded = 0
    for seq, eid in finishes:
        (ep,) = store.list_episodes(limit=None, where=EpisodeQuery(episode_ids=[eid]), counts=False)
        members = (
            [ep]
            if ep.group_id is None
            else store.list_episodes(limit=None, where=EpisodeQuery(group_id=ep.group_id), counts=False)
        )
        if any(m.status == "running" for m in members):
            continue  # comes with the finish that completes it
        if keys.last_finish(store, [m.id for m in members]) != seq:
            continue  # came (or comes) with its last finish
        got, left_out = _rows(store, sorted(members, key=lambda e: e.id), strategy, estimator, std_estimator)
        rows += got
        excluded += left_out
    return rows, cursor, excluded


def _rows(
    store: Store, episodes: Sequence[Any], strategy: str, estimator: str, std_estimator: str
) -> tuple[list[dict[str, Any]], int]:
    """Export rows of these episodes, built as `polarproxy export` builds them, and how many of the episodes
    left their group as `infra` failures."""
    from polarproxy.export.advantages import AdvantageOptions, compute_advantages
    from polarproxy.export.rows import trajectory_to_row
    from polarproxy.export.run import trajectories
    from polarproxy.store.token_calls import iter_token_calls

    if not episodes:
        return [], 0
    chosen = {e.id: e for e in episodes}
    options = AdvantageOptions(estimator, std_estimator=std_estimator)
    report = None
    if estimator != "none":
        report = compute_advantages(chosen.values(), options, store.answered_calls(list(chosen)))
    # The store's token arrays (store/token_calls.py), as exports read them; `where`, not exact IDs: an
    # episode removed since it was listed is left out, not an error.
    calls = iter_token_calls(store, where=EpisodeQuery(episode_ids=list(chosen)))
    rows = [trajectory_to_row(t) for t in trajectories(calls, chosen, strategy, report=report)]
    return rows, 0 if report is None else len(report.excluded_failed)
