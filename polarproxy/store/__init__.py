"""The store: episodes and calls with their exact token arrays (SQLite by default, any SQLAlchemy URL).

`from polarproxy.store import Store` imports SQLAlchemy; the records and errors alone do not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from polarproxy.store.errors import AmbiguousIdError, NotFoundError, StoreError
from polarproxy.store.records import Call, CallResult, CallStart, Episode, EpisodeStart

if TYPE_CHECKING:
    from polarproxy.store.store import Store, default_db_url

__all__ = [
    "AmbiguousIdError",
    "Call",
    "CallResult",
    "CallStart",
    "Episode",
    "EpisodeStart",
    "NotFoundError",
    "Store",
    "StoreError",
    "default_db_url",
]


def __getattr__(name: str) -> Any:
    if name in ("Store", "default_db_url"):
        from polarproxy.store import store

        return getattr(store, name)
    raise AttributeError(f"module 'polarproxy.store' has no attribute {name!r}")
