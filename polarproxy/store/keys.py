"""Episodes of `serve`'s control API: the API key each was given (as a hash) and the order they finished in.

An episode created through `POST /polarproxy/v1/episodes` gets a fresh random API key; the harness sends it
as its provider key, and the proxy finds the episode by the key's SHA-256 (`key_hash`). The key itself is
never stored (T5). `POST .../finish` appends a row to `episode_finishes`, whose `seq` is the cursor of the
trajectory stream: a puller that asks for finishes after the last `seq` it saw gets each episode once.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from sqlalchemy import and_, select, text

from polarproxy.store import owners, schema

if TYPE_CHECKING:
    from polarproxy.store.store import Store

K = schema.episode_keys
F = schema.episode_finishes
E = schema.episodes
W = schema.writers

KEY_PREFIX = "ppk_"  # what the keys look like: a harness's other keys (placeholders) are told apart cheaply
# the headers a provider SDK sends its key in besides `Authorization: Bearer` (Anthropic, Gemini, Azure);
# Gemini's may come as `?key=` too. The gateway's routing and each episode's bridge read the same ones.
KEY_HEADERS = ("x-api-key", "x-goog-api-key", "api-key")


def new_key() -> str:
    """A fresh API key: the prefix and 32 random bytes (URL-safe base64)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class KeyedEpisode:
    """The episode an API key names, as the store has it now."""

    episode_id: str
    status: str  # the episode's status: running, ok, failed, interrupted
    writer_id: str | None
    finished: bool  # finished through the control API (or no longer running)


def add_key(store: Store, episode_id: str, key: str) -> None:
    """Record the hash of `key` as the API key of `episode_id`."""
    with store._write() as conn:
        conn.execute(K.insert().values(episode_id=episode_id, key_hash=key_hash(key), created_at=time.time()))


def lookup(store: Store, key: str) -> KeyedEpisode | None:
    """The episode whose API key is `key`, or None."""
    query = (
        select(K.c.episode_id, K.c.finished_at, E.c.status, E.c.writer_id)
        .join(E, E.c.id == K.c.episode_id)
        .where(K.c.key_hash == key_hash(key))
    )
    with store._read() as conn:
        row = conn.execute(query).first()
    if row is None:
        return None
    return KeyedEpisode(
        episode_id=row.episode_id,
        status=row.status,
        writer_id=row.writer_id,
        finished=row.finished_at is not None or row.status != "running",
    )


def record_finish(store: Store, episode_id: str) -> int:
    """Mark the episode finished in the control API's order; returns its place in that order (`seq`)."""
    now = time.time()
    with store._write() as conn:
        if conn.dialect.name == "postgresql":
            # finishes commit in `seq` order (SQLite's one writer gives that), so that a puller whose cursor
            # passed a `seq` never misses a smaller one committed later; reads are not blocked
            conn.execute(text("LOCK TABLE episode_finishes IN EXCLUSIVE MODE"))
        conn.execute(K.update().where(K.c.episode_id == episode_id).values(finished_at=now))
        result = conn.execute(F.insert().values(episode_id=episode_id, finished_at=now))
        return int(result.inserted_primary_key[0])


def finishes_after(store: Store, seq: int, *, limit: int) -> list[tuple[int, str]]:
    """(seq, episode ID) of the episodes finished after `seq`, oldest first."""
    with store._read() as conn:
        rows = conn.execute(
            select(F.c.seq, F.c.episode_id).where(F.c.seq > seq).order_by(F.c.seq).limit(limit)
        )
        return [(int(r.seq), str(r.episode_id)) for r in rows]


def last_finish(store: Store, episode_ids: list[str]) -> int | None:
    """The highest finish `seq` among these episodes (None: none finished through the control API)."""
    with store._read() as conn:
        rows = conn.execute(select(F.c.seq).where(F.c.episode_id.in_(episode_ids))).scalars().all()
    return max(rows) if rows else None


def detach(store: Store, writer_id: str) -> int:
    """Let go of the keyed episodes this writer records that are not finished, so that stopping the proxy
    does not end them (another proxy on the same database serves their next calls); returns how many."""
    keyed = select(K.c.episode_id).where(K.c.finished_at.is_(None))
    with store._write() as conn:
        return conn.execute(
            E.update()
            .where(and_(E.c.writer_id == writer_id, E.c.status == "running", E.c.id.in_(keyed)))
            .values(writer_id=None)
        ).rowcount


def episode_state(store: Store, episode_id: str) -> tuple[str, str | None] | None:
    """(status, writer ID) of an episode, or None when there is no such episode."""
    with store._read() as conn:
        row = conn.execute(select(E.c.status, E.c.writer_id).where(E.c.id == episode_id)).first()
    return None if row is None else (str(row.status), row.writer_id)


def episode_metadata(store: Store, episode_id: str) -> dict[str, Any] | None:
    """The metadata of the episode with exactly this ID, or None when there is no such episode."""
    with store._read() as conn:
        row = conn.execute(select(E.c.metadata_json).where(E.c.id == episode_id)).first()
    return None if row is None else orjson.loads(row.metadata_json)


def writer_alive(store: Store, writer_id: str, *, stale_after: float = owners.STALE_AFTER_S) -> bool:
    """Whether the recording process `writer_id` still runs (store/owners.py `is_alive`)."""
    with store._read() as conn:
        row = conn.execute(select(W).where(W.c.id == writer_id)).first()
    if row is None:
        return False
    return owners.is_alive(dict(row._mapping), now=time.time(), stale_after=stale_after)[0]
