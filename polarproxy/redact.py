"""T5: the one list of secrets, and how they are replaced before anything is stored or logged.

Used by the capture layer (before a request is parked or recorded) and again by the store (defensively,
for writers that forgot). Values are replaced by `<redacted>`; everything else is kept byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import quote, unquote_plus

REDACTED = "<redacted>"
SECRET_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "x-api-key", "x-goog-api-key", "api-key", "cookie", "set-cookie"}
)
# a header whose name holds one of these is a secret too (`x-auth-token`, `x-amz-security-token`,
# `x-goog-signature`, `session_id`); names that hold none (`content-type`, `keep-alive`) are kept
SECRET_HEADER_PARTS = ("auth", "token", "key", "secret", "signature", "session", "cookie")
SECRET_QUERY_KEYS = frozenset(
    {
        "key",
        "api_key",
        "api-key",
        "apikey",
        "access_token",
        "token",
        "sig",
        "signature",
        "code",
        "secret",
        "password",
    }
)


def is_secret_header(name: str) -> bool:
    """Whether a header's value is a secret: one of `SECRET_HEADERS`, or a name holding a part of
    `SECRET_HEADER_PARTS`."""
    lowered = name.lower()
    return lowered in SECRET_HEADERS or any(part in lowered for part in SECRET_HEADER_PARTS)


def redact_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Headers as a dict (a repeated name's values joined with ', '), secret values replaced."""
    out: dict[str, str] = {}
    for name, value in headers:
        v = REDACTED if is_secret_header(name) else value
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


# ---- command lines ---------------------------------------------------------------------------------------

# Words that, as the last part of an option or variable name (`--api-key`, `HF_TOKEN`, `db_password`), say
# that its value is a secret. Plurals and other words are not secrets: `--max-tokens 5`, `--key-file F`.
SECRET_NAME_WORDS = frozenset(
    {
        "key",
        "apikey",
        "token",
        "secret",
        "password",
        "passwd",
        "pass",
        "passphrase",
        "auth",
        "credential",
        "credentials",
        "cookie",
        "bearer",
        "signature",
        "sig",
        "session",
    }
)
_NAME_PARTS = re.compile(r"[-_.]+")
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_.-]*)=(.*)$", re.DOTALL)
_HEADER = re.compile(r"^(\s*)([A-Za-z0-9-]+)(\s*:\s*)(.*)$", re.DOTALL)
_SCHEME_TOKEN = re.compile(r"\b(Bearer|Basic|Token)(\s+)[^\s\"',;]+", re.IGNORECASE)
# Provider keys by their shape: OpenAI/Anthropic `sk-...`, GitHub, Slack, Hugging Face, Google, AWS.
_KEY_LIKE = re.compile(
    r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-]{8,}"
    r"|\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{16,}|\bgithub_pat_[A-Za-z0-9_]{16,}"
    r"|\bxox[abprs]-[A-Za-z0-9\-]{8,}|\bhf_[A-Za-z0-9]{16,}"
    r"|\bAIza[A-Za-z0-9_\-]{20,}|\bAKIA[A-Z0-9]{16}"
)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s\"'<>]+")
_URL_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*://[^/@:\s]*):([^/@\s]*)@")
_JSON_SECRET = re.compile(r"(\"([A-Za-z0-9_\-]+)\"\s*:\s*\")((?:[^\"\\]|\\.)*)(\")")
# `NAME=value` inside free text (a verifier's output: `token=abc`, `PASSWORD=hunter2`)
_QUOTED_REDACTED = quote(REDACTED)  # as a URL's query holds it
_TEXT_ASSIGNMENT = re.compile(r"(?<![A-Za-z0-9_.-])([A-Za-z_][A-Za-z0-9_.-]*)=([^\s\"'&,;]+)")


def is_secret_name(name: str) -> bool:
    """Whether an option or variable name says its value is a secret (`--api-key`, `OPENAI_API_KEY`,
    `PGPASSWORD`); `--max-tokens`, `--key-file` and `PWD` are not."""
    name = name.lstrip("-").lower()
    if not name:
        return False
    if name.endswith(("password", "passwd", "apikey", "api_key", "secret", "token")):
        return True
    return _NAME_PARTS.split(name)[-1] in SECRET_NAME_WORDS


def _redact_url(url: str) -> str:
    url = _URL_USERINFO.sub(lambda m: f"{m.group(1)}:{REDACTED}@", url)
    return redact_path(url) if "?" in url else url


def _redact_assignment(m: re.Match[str]) -> str:
    if not is_secret_name(m.group(1)) or m.group(2) in (REDACTED, _QUOTED_REDACTED):
        return m.group(0)
    return f"{m.group(1)}={REDACTED}"


def redact_text(text: str) -> str:
    """Secrets inside one free-form string: bearer tokens, provider-shaped keys, URL passwords and secret
    query parameters, `token=...`-style assignments and `"password": "..."`-style JSON members; the rest
    kept verbatim."""
    text = _SCHEME_TOKEN.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    text = _KEY_LIKE.sub(REDACTED, text)
    text = _URL.sub(lambda m: _redact_url(m.group(0)), text)
    text = _TEXT_ASSIGNMENT.sub(_redact_assignment, text)
    return _JSON_SECRET.sub(
        lambda m: f"{m.group(1)}{REDACTED}{m.group(4)}" if is_secret_name(m.group(2)) else m.group(0), text
    )


def _redact_word(arg: str) -> str:
    header = _HEADER.match(arg)
    if header and is_secret_header(header.group(2)):
        return f"{header.group(1)}{header.group(2)}{header.group(3)}{REDACTED}"
    if arg.startswith("-"):
        name, eq, value = arg.partition("=")
        if eq and is_secret_name(name):
            return f"{name}={REDACTED}"
        if eq:
            return f"{name}={_redact_word(value)}"  # --header=Authorization: Bearer x
        return redact_text(arg)
    assignment = _ASSIGNMENT.match(arg)
    if assignment and is_secret_name(assignment.group(1)):
        return f"{assignment.group(1)}={REDACTED}"
    return redact_text(arg)


def _takes_secret(option: str) -> bool:
    """Whether `option` (a whole argument, no `=`) is a flag whose next argument is a secret."""
    if not option.startswith("-") or "=" in option or len(option) < 2:
        return False
    bare = option.lstrip("-").lower()
    if bare.startswith(("no-", "no_", "without-")):  # --no-auth: a switch, not a value
        return False
    return is_secret_name(option)


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line as it may be stored or printed (T5): the values of secret options (`--api-key X`,
    `--token=X`, `--password X`), secret assignments (`OPENAI_API_KEY=X`, `PGPASSWORD=X`), secret headers
    (`-H "Authorization: Bearer X"`), bearer tokens and provider-shaped keys anywhere (`sk-...`), URL
    passwords and secret query parameters replaced by `<redacted>`. Other arguments are kept verbatim."""
    out: list[str] = []
    secret_next = False
    user_next = False
    for arg in argv:
        if secret_next:
            secret_next = False
            if not arg.startswith("--"):
                out.append(REDACTED)
                continue
        if user_next:  # curl -u USER:PASSWORD
            user_next = False
            user, colon, _password = arg.partition(":")
            if colon and not arg.startswith("-"):
                out.append(f"{user}:{REDACTED}")
                continue
        out.append(_redact_word(arg))
        secret_next = _takes_secret(arg)
        user_next = arg in ("-u", "--user", "--proxy-user", "-U")
    return out


def without_userinfo(url: str) -> str:
    """`url` without user:password@ and without a trailing slash (what errors and logs may show of an HTTP
    URL: a gateway's, a backend's)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url.rstrip("/")
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc)).rstrip("/")
