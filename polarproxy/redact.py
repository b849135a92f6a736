"""T5: the one list of secrets, and how they are replaced before anything is stored or logged.

Used by the capture layer (before a request is parked or recorded) and again by the store (defensively,
for writers that forgot). Values are replaced by `<redacted>`; everything else is kept byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import quote, unquote_plus

REDACTED = "<redacted>"
SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "x-goog-api-key", "api-key", "cookie", "set-cookie"}
)
SECRET_QUERY_KEYS = frozenset({"key", "api_key", "api-key", "apikey", "access_token", "token"})


def redact_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Headers as a dict (a repeated name's values joined with ', '), secret values replaced."""
    out: dict[str, str] = {}
    for name, value in headers:
        v = REDACTED if name.lower() in SECRET_HEADERS else value
        out[name] = f"{out[name]}, {v}" if name in out else v
    return out


def redact_path(path: str) -> str:
    """A request path with the value of every secret query parameter replaced; the rest kept verbatim."""
    base, sep, query = path.partition("?")
    if not sep:
        return path
    parts = query.split("&")
    for i, part in enumerate(parts):
        name, eq, value = part.partition("=")
        if eq and unquote_plus(name).lower() in SECRET_QUERY_KEYS and unquote_plus(value) != REDACTED:
            parts[i] = f"{name}={quote(REDACTED)}"
    return f"{base}?{'&'.join(parts)}"
