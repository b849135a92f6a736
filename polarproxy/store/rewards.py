"""Rewards of episodes and calls, and where each came from: the `Store` methods behind `record --reward-cmd`,
`polarproxy reward` and the reward endpoint (a mixin of `Store`, which gives it `_write` and `_read`)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, get_args

import orjson
from sqlalchemy import Connection, func, select

from polarproxy.store import schema
from polarproxy.store.errors import NotFoundError
from polarproxy.store.records import RewardOrigin, RewardRecord, RewardSource
from polarproxy.store.storable import storable

E = schema.episodes
C = schema.calls
R = schema.rewards
REWARD_SOURCES: tuple[str, ...] = get_args(RewardSource)


class _Keep:
    """The type of KEEP: leave the episode's reward as it is."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP = _Keep()


MAX_PATCH_CHARS = 256_000  # a diff longer than this keeps its head and says how much was cut
MAX_GRADING_TESTS = 5_000  # per-test results kept with a reward; the rest are counted
MAX_TEST_ID_CHARS = 1_000  # a longer test ID is cut


def bounded_patch(patch: str | None) -> str | None:
    if patch is None or len(patch) <= MAX_PATCH_CHARS:
        return patch
    return (
        patch[:MAX_PATCH_CHARS]
        + f"\n[patch cut: {len(patch) - MAX_PATCH_CHARS} more characters not stored]\n"
    )


def valid_grading(value: object) -> dict[str, Any] | None:
    """`{"tests": {test ID: status}, "resolved": bool, "parser": str}` (the last two optional) taken from a
    grader's output or a request, or None when `value` is not of that shape."""
    if not isinstance(value, dict):
        return None
    tests = value.get("tests")
    if not isinstance(tests, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in tests.items()
    ):
        return None
    out: dict[str, Any] = {"tests": tests}
    if isinstance(value.get("resolved"), bool):
        out["resolved"] = value["resolved"]
    if isinstance(value.get("parser"), str):
        out["parser"] = value["parser"]
    return out


def grading_json(grading: Mapping[str, Any]) -> str:
    """The grader's results as stored: at most MAX_GRADING_TESTS tests (the count of the rest kept)."""
    kept = dict(grading)
    tests = kept.get("tests")
    if isinstance(tests, dict):
        if len(tests) > MAX_GRADING_TESTS:
            kept["tests_not_stored"] = len(tests) - MAX_GRADING_TESTS
        kept["tests"] = {
            str(t)[:MAX_TEST_ID_CHARS]: str(s)[:64] for t, s in list(tests.items())[:MAX_GRADING_TESTS]
        }
    return orjson.dumps(kept).decode()


def _reward_value(value: float | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"Reward {value!r} is not a finite number. Give a number such as 1.0 or 0.25.")
    return float(value)


class RewardsMixin:
    """Reward writes and reads; `Store` provides the transactions."""

    dialect: str  # provided by Store

    def _write(self) -> AbstractContextManager[Connection]: ...  # provided by Store

    def _read(self) -> AbstractContextManager[Connection]: ...  # provided by Store

    def set_reward(
        self,
        episode_id: str,
        reward: float | None,
        *,
        call: int | None = None,
        origin: RewardOrigin | None = None,
    ) -> RewardRecord:
        """Set (or clear, with None) the episode's reward, or with `call` (its sequence number, as
        `polarproxy show` prints it) that call's, which overrides the episode's for that call. `origin` says
        where the reward came from (default: source 'cli'); it is recorded with the value."""
        origin = origin or RewardOrigin(source="cli")
        if call is None:
            return self.set_rewards(episode_id, episode=reward, origin=origin)[0]
        return self.set_rewards(episode_id, calls={call: reward}, origin=origin)[0]

    def set_rewards(
        self,
        episode_id: str,
        *,
        episode: float | _Keep | None = KEEP,
        calls: Mapping[int, float | None] | None = None,
        origin: RewardOrigin,
    ) -> list[RewardRecord]:
        """Set the episode's reward (unless `episode` is KEEP) and per-call rewards (by sequence number), and
        record where each came from, in one transaction. Raises NotFoundError for an unknown episode or call
        number (nothing is written then), ValueError for a reward that is not a finite number."""
        calls = dict(calls or {})
        values: list[tuple[int | None, float | None]] = []
        if not isinstance(episode, _Keep):
            values.append((None, _reward_value(episode)))
        values += [(int(seq), _reward_value(r)) for seq, r in sorted(calls.items())]
        if origin.source not in REWARD_SOURCES:
            raise ValueError(
                f"Unknown reward source {origin.source!r}. Must be one of {', '.join(map(repr, REWARD_SOURCES))}."
            )
        now = time.time()
        out: list[RewardRecord] = []
        with self._write() as conn:
            if conn.execute(select(E.c.id).where(E.c.id == episode_id)).first() is None:
                raise NotFoundError(f"No episode {episode_id!r}. Run `polarproxy ls` to list them.")
            seqs = [seq for seq, _ in values if seq is not None]
            call_ids: dict[int, str] = {}
            if seqs:
                call_ids = {
                    row.seq: row.id
                    for row in conn.execute(
                        select(C.c.seq, C.c.id).where(C.c.episode_id == episode_id, C.c.seq.in_(seqs))
                    )
                }
                missing = sorted(set(seqs) - set(call_ids))
                if missing:
                    n = conn.execute(
                        select(func.count()).select_from(C).where(C.c.episode_id == episode_id)
                    ).scalar_one()
                    have = f"calls 0..{n - 1}" if n else "no calls"
                    raise NotFoundError(
                        f"Episode {episode_id} has no call {', '.join(f'#{m}' for m in missing)}; it has {have}. "
                        f"Run `polarproxy show {episode_id}` to see them."
                    )
            for seq, reward in values:
                if seq is None:
                    conn.execute(E.update().where(E.c.id == episode_id).values(reward=reward))
                else:
                    conn.execute(C.update().where(C.c.id == call_ids[seq]).values(reward=reward))
                conn.execute(
                    R.insert().values(
                        episode_id=episode_id,
                        call_seq=seq,
                        call_id=None if seq is None else call_ids[seq],
                        reward=reward,
                        source=origin.source,
                        command_json=None
                        if origin.command is None
                        else orjson.dumps(list(origin.command)).decode(),
                        exit_code=origin.exit_code,
                        output_tail=storable(origin.output_tail, self.dialect),
                        note=storable(origin.note, self.dialect),
                        created_at=now,
                        patch=storable(bounded_patch(origin.patch), self.dialect),
                        grading_json=None if origin.grading is None else grading_json(origin.grading),
                    )
                )
                out.append(
                    RewardRecord(episode_id, seq, None if seq is None else call_ids[seq], reward, origin, now)
                )
        return out

    def list_rewards(self, episode_id: str) -> list[RewardRecord]:
        """Every reward set for the episode (exact ID), oldest first: the value and where it came from."""
        with self._read() as conn:
            rows = conn.execute(select(R).where(R.c.episode_id == episode_id).order_by(R.c.id)).all()
        return [
            RewardRecord(
                episode_id=r.episode_id,
                call_seq=r.call_seq,
                call_id=r.call_id,
                reward=r.reward,
                origin=RewardOrigin(
                    source=r.source,
                    command=None if r.command_json is None else orjson.loads(r.command_json),
                    exit_code=r.exit_code,
                    output_tail=r.output_tail,
                    note=r.note,
                    patch=r.patch,
                    grading=None if r.grading_json is None else orjson.loads(r.grading_json),
                ),
                created_at=r.created_at,
            )
            for r in rows
        ]
