"""Rebuilding token arrays on read: a prompt may be stored as a reference to an earlier call plus the
tokens it adds (`full_sequence(base)[:base_len] + tail`, full_sequence(call) = prompt + output)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row

from polarproxy.store import schema
from polarproxy.store.arrays import unpack_ids, unpack_ids_array
from polarproxy.store.errors import StoreError

C = schema.calls
_TOKEN_CACHE = 32  # rebuilt token sequences kept while reading (prefix-stored calls read their base's)


@dataclass(slots=True, frozen=True)
class TokenRow:
    id: str
    base_id: str | None
    base_len: int
    tail: bytes
    output: bytes


TOKEN_COLUMNS = (C.c.id, C.c.prompt_base_call_id, C.c.prompt_base_len, C.c.prompt_tail_ids, C.c.output_ids)


def token_row(row: Row[Any]) -> TokenRow:
    m = row._mapping
    return TokenRow(
        m["id"], m["prompt_base_call_id"], m["prompt_base_len"], m["prompt_tail_ids"], m["output_ids"]
    )


class Rebuilder:
    """Rebuilds prompts stored as `full_sequence(base)[:base_len] + tail`, where
    full_sequence(call) = prompt(call) + output(call), following bases iteratively (no recursion limit)."""

    def __init__(self, load: Callable[[str], TokenRow]):
        self._load = load
        self._rows: OrderedDict[str, TokenRow] = OrderedDict()
        self._full: OrderedDict[str, Any] = OrderedDict()

    @staticmethod
    def _remember(cache: OrderedDict[str, Any], key: str, value: Any) -> None:
        cache[key] = value
        cache.move_to_end(key)
        while len(cache) > _TOKEN_CACHE:
            cache.popitem(last=False)

    def prompt(self, row: TokenRow) -> list[int]:
        self._remember(self._rows, row.id, row)
        if row.base_id is None:
            if row.base_len:
                raise StoreError(f"Call {row.id} has prompt_base_len {row.base_len} but no base call.")
            return unpack_ids(row.tail)
        base = self._full_sequence(row.base_id)
        if row.base_len > len(base):
            raise StoreError(
                f"Call {row.id} takes {row.base_len} tokens from its base call {row.base_id}, "
                f"which has only {len(base)}. The database is inconsistent."
            )
        return base[: row.base_len].tolist() + unpack_ids(row.tail)

    def _full_sequence(self, call_id: str) -> Any:
        chain: list[TokenRow] = []
        seen: set[str] = set()
        seq = None
        current = call_id
        while True:
            if current in self._full:
                seq = self._full[current]
                break
            if current in seen:
                raise StoreError(
                    f"Call {current} is its own prompt base (a cycle). The database is inconsistent."
                )
            seen.add(current)
            row = self._rows.get(current) or self._load(current)
            chain.append(row)
            if row.base_id is None:
                break
            current = row.base_id
        for row in reversed(chain):
            if row.base_id is None:
                prompt = unpack_ids_array(row.tail)
            else:
                if row.base_len > len(seq):
                    raise StoreError(
                        f"Call {row.id} takes {row.base_len} tokens from its base call {row.base_id}, "
                        f"which has only {len(seq)}. The database is inconsistent."
                    )
                prompt = seq[: row.base_len] + unpack_ids_array(row.tail)
            seq = prompt + unpack_ids_array(row.output)
            self._remember(self._full, row.id, seq)
        return seq
