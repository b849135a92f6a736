"""Errors that reach a user: each names the bad value, the allowed values and the next step."""

from __future__ import annotations


class PolarproxyError(Exception):
    """Base class. `hint` is the next step, printed on its own line by the CLI."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(PolarproxyError):
    """The user asked for something that cannot work as given (bad flag value, missing folder)."""
