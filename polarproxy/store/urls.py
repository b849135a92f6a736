"""Where the store lives: a path, `:memory:`, or a URL, turned into a SQLAlchemy URL; and how it is shown.

- a plain path is a SQLite file (parent folders are created by `Store.open`), `:memory:` a private
  in-memory SQLite database;
- `postgresql://...` and `postgres://...` use the psycopg 3 driver (`postgresql+psycopg://...`); a URL that
  names its driver (`postgresql+psycopg://`, `sqlite:///`) is used as given.

`display_url` is the only form that may be printed or logged (T5): the password is replaced and so is any
`password=` query parameter, by `***`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # SQLAlchemy is imported where a URL is parsed: printing an error needs none (~0.3 s)
    from sqlalchemy.engine import URL

HIDDEN = "***"  # what SQLAlchemy shows for a hidden password
_PG_SCHEMES = {"postgresql": "postgresql+psycopg", "postgres": "postgresql+psycopg"}
_SECRET_QUERY = re.compile(r"(?i)([?&](?:password|sslpassword)=)[^&]*")
_USERINFO_PASSWORD = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@]*):[^@/]*@")


def is_url(target: str) -> bool:
    return "://" in target


def sqlalchemy_url(target: str) -> URL:
    """The SQLAlchemy URL for a URL string (not a path): PostgreSQL URLs get the psycopg 3 driver."""
    from sqlalchemy.engine import make_url

    url = make_url(target)
    driver = _PG_SCHEMES.get(url.drivername)
    return url.set(drivername=driver) if driver else url


def display_url(target: str | URL) -> str:
    """`target` with any password replaced by `<redacted>`; paths, and URLs that hold none (no user info,
    no password parameter), are returned unchanged."""
    if not isinstance(target, str):  # a SQLAlchemy URL
        return _SECRET_QUERY.sub(rf"\g<1>{HIDDEN}", target.render_as_string(hide_password=True))
    if not is_url(target) or ("@" not in target and not _SECRET_QUERY.search(target)):
        return target
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return display_url(make_url(target))
    except (ArgumentError, ValueError):  # not parseable: redact textually
        return _SECRET_QUERY.sub(rf"\g<1>{HIDDEN}", _USERINFO_PASSWORD.sub(rf"\g<1>:{HIDDEN}@", target))


_URL_IN_TEXT = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")


def hide_passwords(text: str) -> str:
    """Free text (an error message, a hint) with the password of every URL in it hidden."""

    def hide(m: re.Match[str]) -> str:
        url = m.group(0).rstrip(".,:;)]}")
        return display_url(url) + m.group(0)[len(url) :]

    return _URL_IN_TEXT.sub(hide, text)
