"""Errors the store raises. Messages name the bad value and the next step."""

from __future__ import annotations


class StoreError(Exception):
    """The database cannot be opened, read or written, or holds something inconsistent."""


class NotFoundError(StoreError, LookupError):
    """No episode or call has the given ID or prefix."""


class AmbiguousIdError(StoreError, LookupError):
    """An ID prefix matches more than one record; `candidates` lists (some of) them."""

    def __init__(self, message: str, candidates: list[str]):
        super().__init__(message)
        self.candidates = candidates
