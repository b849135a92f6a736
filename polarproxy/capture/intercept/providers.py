"""Which traffic intercept mode records: the providers' model endpoints, plus hosts the user names.

A request is recorded when its host is a known provider host and its path is one of that provider's model
endpoints, or its host matches a `--host` pattern (a shell glob such as `*.openai.azure.com` or a host
name, optionally with `:PORT`) and its path is any endpoint a dialect reads. Everything else passes
through untouched: its TLS is not even opened (mitmproxy `allow_hosts`).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from polarproxy.dialects import Dialect, route

KNOWN_HOSTS: dict[str, tuple[str, ...]] = {
    "api.openai.com": ("openai_chat", "openai_responses"),
    "api.anthropic.com": ("anthropic",),
    "generativelanguage.googleapis.com": ("gemini",),
}


@dataclass(frozen=True, slots=True)
class Providers:
    extra: tuple[str, ...] = field(default_factory=tuple)  # --host patterns

    @staticmethod
    def of(patterns: Sequence[str]) -> Providers:
        bad = [p for p in patterns if not p or "/" in p or " " in p]
        if bad:
            raise ValueError(
                f"Bad --host pattern {bad[0]!r}: give a host name or glob, optionally with :PORT, "
                "e.g. 'llm.example.com' or '*.openai.azure.com'."
            )
        return Providers(tuple(p.lower() for p in patterns))

    def _user_host(self, host: str, port: int) -> bool:
        return any(fnmatch.fnmatchcase(h, p) for p in self.extra for h in (host, f"{host}:{port}"))

    def match(self, host: str, port: int, method: str, path: str) -> Dialect | None:
        """The dialect that reads this request, or None when it is not recorded (`path` without query)."""
        host = host.lower().rstrip(".")
        dialect = route(method, path)
        if dialect is None:
            return None
        allowed = KNOWN_HOSTS.get(host)
        if allowed is not None and dialect.name in allowed and path.startswith(("/v1/", "/v1beta/")):
            return dialect
        return dialect if self._user_host(host, port) else None

    def dialect_for_host(self, host: str) -> str:
        """The dialect a host speaks by default (for calls that failed before a request was seen)."""
        allowed = KNOWN_HOSTS.get(host.lower().rstrip("."), ())
        return allowed[0] if allowed else ""

    def intercepts(self, host: str, port: int = 443) -> bool:
        host = host.lower().rstrip(".")
        return host in KNOWN_HOSTS or self._user_host(host, port)

    def allow_hosts(self) -> list[str]:
        """mitmproxy `allow_hosts` regexes (matched against 'host:port'): only these get their TLS opened."""
        rx = [rf"^{re.escape(h)}:\d+$" for h in KNOWN_HOSTS]
        for p in self.extra:
            glob = p if ":" in p else f"{p}:*"
            rx.append("^" + fnmatch.translate(glob).replace(r"\Z", "$"))
        return rx


__all__ = ["KNOWN_HOSTS", "Providers"]
