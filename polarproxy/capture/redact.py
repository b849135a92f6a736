"""T5: secrets are replaced before anything is stored or logged."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode

REDACTED = "<redacted>"
SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "x-goog-api-key", "api-key", "cookie", "set-cookie"}
)
SECRET_QUERY_KEYS = frozenset({"key", "api_key", "apikey", "api-key", "access_token", "token"})


def redact_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Headers as a dict (repeated names joined with ', '), secret values replaced."""
    out: dict[str, str] = {}
    for name, value in headers:
        v = REDACTED if name.lower() in SECRET_HEADERS else value
        out[name] = f"{out[name]}, {v}" if name in out else v
    return out


def redact_query(query: str) -> str:
    """A query string with secret parameters' values replaced (order kept)."""
    if not query:
        return query
    pairs = parse_qsl(query, keep_blank_values=True)
    return urlencode([(k, REDACTED if k.lower() in SECRET_QUERY_KEYS else v) for k, v in pairs], safe="<>")


def redact_path(path: str) -> str:
    """A request path with its query string redacted."""
    base, sep, query = path.partition("?")
    return base + sep + redact_query(query) if sep else path
