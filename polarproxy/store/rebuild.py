"""Rebuilding token arrays on read: a prompt may be stored as a reference to an earlier call plus the
tokens it adds (`full_sequence(base)[:base_len] + tail`, full_sequence(call) = prompt + output)."""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row

from polarproxy.store import schema
from polarproxy.store.arrays import unpack_ids, unpack_ids_array
from polarproxy.store.errors import StoreError
from polarproxy.store.records import Call

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
        return (base[: row.base_len] + unpack_ids_array(row.tail)).tolist()  # one list built, not three

    def note(self, row: TokenRow) -> int:
        """Remember `row` and rebuild its full sequence as an array (memory copies, no Python ints), so
        that its prompt can be rebuilt later from the cache (`prompt`); return its prompt's length."""
        if row.base_id is None and row.base_len:
            raise StoreError(f"Call {row.id} has prompt_base_len {row.base_len} but no base call.")
        self._remember(self._rows, row.id, row)
        return len(self._full_sequence(row.id)) - len(row.output) // 4

    def full_sequence(self, call_id: str) -> array:
        """prompt(call) + output(call) as an `array('i')`."""
        return self._full_sequence(call_id)

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


@dataclass(slots=True, frozen=True)
class BodyRow:
    id: str
    base_id: str | None
    delta: bytes | None
    request_body: str
    conversation_json: str | None


BODY_COLUMNS = (C.c.id, C.c.prompt_base_call_id, C.c.bodies_delta, C.c.request_body, C.c.conversation_json)


def body_row(row: Row[Any]) -> BodyRow:
    m = row._mapping
    delta = m["bodies_delta"]
    return BodyRow(
        m["id"],
        m["prompt_base_call_id"],
        None if delta is None else bytes(delta),
        m["request_body"],
        m["conversation_json"],
    )


class BodyRebuilder:
    """Rebuilds request bodies and conversations stored as edits of the prompt base's (textdelta.py),
    following bases iteratively and keeping the most recent ones, so reading an episode in order is linear."""

    def __init__(self, load: Callable[[str], BodyRow]):
        self._load = load
        self._full: OrderedDict[str, tuple[str, str | None]] = OrderedDict()

    def bodies(self, row: BodyRow) -> tuple[str, str | None]:
        """(request_body, conversation_json) of the call."""
        if row.delta is None:
            out = (row.request_body, row.conversation_json)
        else:
            out = self._apply(row, self.full(row.base_id, row.id))
        Rebuilder._remember(self._full, row.id, out)
        return out

    def full(self, call_id: str | None, of: str) -> tuple[str, str | None]:
        if call_id is None:
            raise StoreError(f"Call {of} stores its request body as an edit but has no base call.")
        chain: list[BodyRow] = []
        current: str | None = call_id
        seen: set[str] = set()
        out: tuple[str, str | None] | None = None
        while current is not None:
            if current in self._full:
                out = self._full[current]
                break
            if current in seen:
                raise StoreError(f"Call {current} is its own base (a cycle). The database is inconsistent.")
            seen.add(current)
            row = self._load(current)
            chain.append(row)
            if row.delta is None:
                break
            current = row.base_id
            if current is None:
                raise StoreError(f"Call {row.id} stores its request body as an edit but has no base call.")
        for row in reversed(chain):
            out = (row.request_body, row.conversation_json) if row.delta is None else self._apply(row, out)
            Rebuilder._remember(self._full, row.id, out)
        assert out is not None
        return out

    @staticmethod
    def _apply(row: BodyRow, base: tuple[str, str | None] | None) -> tuple[str, str | None]:
        from polarproxy.store import textdelta

        assert base is not None and row.delta is not None
        try:
            body, conv = textdelta.decode(base, row.delta)
        except ValueError as exc:
            raise StoreError(f"Call {row.id}'s stored request body cannot be rebuilt: {exc}.") from exc
        return body or "", conv


_PROMPT_SLOT = Call.__dict__["prompt_ids"]  # the slot that holds a Call's prompt IDs


class LazyPromptCall(Call):
    """A Call whose `prompt_ids` list is rebuilt when first read (then kept); `prompt_len` is known at once.

    From `Store.iter_calls(lazy_prompts=True)`, for readers that need most prompts only by length (prefix
    merge reads the leaf's): a call that extends an earlier one then costs memory copies of its token array,
    not one Python int per token. Read `prompt_ids` while the store is open (the rebuild may read base rows).
    It is a Call subclass: dataclass equality holds only between two LazyPromptCalls."""

    __slots__ = ("_rebuild", "prompt_len")

    _rebuild: Callable[[], list[int]] | None
    prompt_len: int

    @classmethod
    def make(cls, rebuild: Callable[[], list[int]], prompt_len: int, **fields: Any) -> LazyPromptCall:
        call = cls.__new__(cls)
        call._rebuild, call.prompt_len = rebuild, prompt_len
        Call.__init__(call, prompt_ids=None, **fields)  # type: ignore[arg-type]  # None: not rebuilt yet
        return call

    @property  # type: ignore[override]
    def prompt_ids(self) -> list[int]:
        try:
            return _PROMPT_SLOT.__get__(self, Call)  # type: ignore[no-any-return]
        except AttributeError:  # not rebuilt yet
            assert self._rebuild is not None
            ids = self._rebuild()
            _PROMPT_SLOT.__set__(self, ids)
            self._rebuild = None
            return ids

    @prompt_ids.setter
    def prompt_ids(self, ids: list[int] | None) -> None:
        if ids is None:
            return
        _PROMPT_SLOT.__set__(self, ids)
        self.prompt_len, self._rebuild = len(ids), None


def prompt_len(call: Call) -> int:
    """The length of a call's prompt, without rebuilding a LazyPromptCall's IDs."""
    return call.prompt_len if isinstance(call, LazyPromptCall) else len(call.prompt_ids)
