"""The one loopback rule (nothing polarproxy starts listens beyond 127.0.0.0/8 or ::1 unless a key guards
it) and the checks that keep a web page elsewhere from driving a local server: a Host header that is not a
loopback name (DNS rebinding) and a write without a JSON content type (a cross-site "simple" POST)."""

from __future__ import annotations

import ipaddress

LOOPBACK_NAMES = ("localhost", "localhost.")
JSON_TYPE = "application/json"


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine's loopback interface (127.0.0.0/8, ::1, localhost)."""
    name = host.strip()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if name.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The host of a Host header, without the port ('[::1]:8080' -> '::1')."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def loopback_host(header: str | None) -> bool:
    """Whether a request's Host header names loopback (a request without one, from a local client, passes)."""
    return not header or is_loopback(host_name(header))


def is_json(content_type: str | None) -> bool:
    """Whether a Content-Type is JSON (`application/json`, parameters allowed): a browser cannot send it
    cross-site without a preflight."""
    return (content_type or "").split(";", 1)[0].strip().lower() == JSON_TYPE
