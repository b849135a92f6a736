"""Which episode a harness call belongs to: the API key it carries, as each SDK sends it, and the routes
confirmed recently (so that routing reads the database only when a route was not confirmed in the last
`ROUTE_TTL_S` seconds)."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from polarproxy.store import keys

if TYPE_CHECKING:
    from mitmproxy import http

ROUTE_TTL_S = 2.0  # how long a confirmed route is trusted without reading the database again
MAX_ROUTES = 4096


@dataclass(frozen=True, slots=True)
class Refusal:
    """A harness call that is not served: the status and message its dialect's error shape carries."""

    status: int
    message: str
    code: str


def request_key(req: http.Request) -> str | None:
    """The API key a harness call carries, as its SDK sends it (OpenAI `Authorization: Bearer`, Anthropic
    `x-api-key`, Gemini `x-goog-api-key` or `?key=`)."""
    auth = req.headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    for header in keys.KEY_HEADERS:
        if req.headers.get(header):
            return req.headers[header].strip()
    key = req.query.get("key") if "?" in req.path else None
    return key or None


class Routes:
    """Routes confirmed recently, each with the time it was confirmed: API-key hash -> episode (read by
    key), and episodes named by header or path (read with their owner checked). An episode finished here
    stops routing at once either way. At most `MAX_ROUTES` of each."""

    def __init__(self, ttl_s: float = ROUTE_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._keys: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._named: OrderedDict[str, float] = OrderedDict()
        self._ended: OrderedDict[str, None] = OrderedDict()  # finished here: never confirmed again

    def keyed(self, key: str) -> str | None:
        hit = self._keys.get(keys.key_hash(key))
        if hit is None or time.monotonic() - hit[1] > self.ttl_s or hit[0] in self._ended:
            return None
        return hit[0]

    def known(self, key: str) -> str | None:
        """The episode `key` was last confirmed for, however long ago (while the store cannot be read: keys
        this proxy issued or confirmed stay valid from memory); None for a key not seen or an ended episode."""
        hit = self._keys.get(keys.key_hash(key))
        if hit is None or hit[0] in self._ended:
            return None
        return hit[0]

    def was_named(self, episode_id: str) -> bool:
        """Whether `episode_id` was ever confirmed here by header or path (however long ago), and not ended."""
        return episode_id in self._named and episode_id not in self._ended

    def named(self, episode_id: str) -> bool:
        at = self._named.get(episode_id)
        return at is not None and time.monotonic() - at <= self.ttl_s

    def confirm(self, episode_id: str, key: str | None = None) -> None:
        """`episode_id` takes calls: by `key`, or (None) when named by header or path."""
        if episode_id in self._ended:  # a read that raced its finish
            return
        now = time.monotonic()
        if key is None:
            self._named[episode_id] = now
            self._named.move_to_end(episode_id)
        else:
            digest = keys.key_hash(key)
            self._keys[digest] = (episode_id, now)
            self._keys.move_to_end(digest)
        self._trim()

    def drop(self, episode_id: str) -> None:
        """The episode finished here."""
        self._named.pop(episode_id, None)
        self._ended[episode_id] = None
        self._trim()

    def _trim(self) -> None:
        for table in (self._named, self._keys, self._ended):
            while len(table) > MAX_ROUTES:
                table.popitem(last=False)
