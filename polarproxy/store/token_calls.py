"""Calls as token arrays, for exports: the store's linear storage read in batches, no `Call` objects.

`iter_token_calls(store, where=...)` yields `TokenCall`s in the order `Store.iter_calls` yields calls
(episode start time, then sequence number). A TokenCall holds the scalar columns an export row needs and its
stored token pieces as bytes. Its full token sequence (prompt + output) is rebuilt only when read, as one
join of the stored pieces (a prompt is `full_sequence(base)[:base_len] + tail`, store/schema.py): memory
copies linear in its length, read as a numpy int32 view, no Python int per token. Its conversation and
completion are parsed only when read (an export reads only the rows' last calls'). The values are those
`Store.iter_calls` gives (call_rows.py), checked against it by tests/export/test_export_fast_path.py.

Memory: the stored rows of one episode (linear in its tokens) and the full sequences of the last few calls.
The lazy parts of a TokenCall read base rows from the store if they are not in memory: read them while the
store is open.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import orjson
from sqlalchemy import bindparam, func, select

from polarproxy.store import schema, textdelta
from polarproxy.store.errors import NotFoundError, StoreError
from polarproxy.store.migrations import sampling_recorded_since
from polarproxy.store.query import EpisodeQuery
from polarproxy.store.records import Call

C = schema.calls
E = schema.episodes
ROWS_PER_READ = 512  # calls read per transaction
_FULL_CACHE = 4  # full sequences and conversations kept per episode (a call's base is usually the one before)
_IDS = np.dtype("<i4")  # the store's packing (store/arrays.py): little-endian int32 IDs, float32 logprobs
_LOGPROBS = np.dtype("<f4")

_COLUMNS = (
    C.c.id,
    C.c.episode_id,
    C.c.seq,
    C.c.status,
    C.c.model,
    C.c.dialect,
    C.c.fidelity,
    C.c.render_mode,
    C.c.backend,
    C.c.backend_kind,
    C.c.finish_reason,
    C.c.weight_version,
    C.c.weight_version_first,
    C.c.weight_version_last,
    C.c.reward,
    C.c.temperature,
    C.c.extended_from,
    C.c.prompt_base_call_id,
    C.c.prompt_base_len,
    C.c.prompt_len,
    C.c.prompt_tail_ids,
    C.c.output_ids,
    C.c.output_logprobs,
    C.c.completion_json,
    C.c.bodies_delta,
    C.c.conversation_json,
    C.c.started_at,
    C.c.logprob_temperature,
    C.c.top_p,
    C.c.top_k,
)
_CHUNK = (
    select(*_COLUMNS)
    .where(C.c.episode_id == bindparam("b_episode"), C.c.seq > bindparam("b_after"))
    .order_by(C.c.seq)
    .limit(ROWS_PER_READ)
)
_GROUP = (
    select(*_COLUMNS)
    .where(C.c.episode_id.in_(bindparam("b_episodes", expanding=True)))
    .order_by(C.c.episode_id, C.c.seq)
)
_TOKENS_OF = select(C.c.prompt_base_call_id, C.c.prompt_base_len, C.c.prompt_tail_ids, C.c.output_ids).where(
    C.c.id == bindparam("b_id")
)
_BODY_OF = select(C.c.prompt_base_call_id, C.c.bodies_delta, C.c.conversation_json).where(
    C.c.id == bindparam("b_id")
)


class _Episode:
    """One episode's stored rows while it is read: the bases its calls' prompts and bodies are rebuilt from."""

    __slots__ = ("_bodies", "_conversations", "_full", "_read", "sampling_since", "tokens")

    def __init__(self, read: Any, sampling_since: float) -> None:
        self._read = read
        self.sampling_since = sampling_since  # calls started before this may lack their temperature column
        self.tokens: dict[str, tuple[str | None, int, bytes, bytes]] = {}  # id -> base, base_len, tail, out
        self._bodies: dict[str, tuple[str | None, Any, str | None]] = {}  # id -> base, delta, conversation
        self._full: OrderedDict[str, bytes] = OrderedDict()
        self._conversations: OrderedDict[str, str | None] = OrderedDict()

    def add(self, row: Any) -> None:
        cid = row[0]
        self.tokens[cid] = (row[17], row[18] or 0, bytes(row[20]), bytes(row[21]))
        self._bodies[cid] = (row[17], row[24], row[25])

    def _token_row(self, call_id: str) -> tuple[str | None, int, bytes, bytes]:
        row = self.tokens.get(call_id)
        if row is not None:
            return row
        with self._read() as conn:
            found = conn.execute(_TOKENS_OF, {"b_id": call_id}).first()
        if found is None:
            raise StoreError(
                f"Call {call_id!r}, the prompt base of another call, is missing. The database is inconsistent."
            )
        return (found[0], found[1] or 0, bytes(found[2]), bytes(found[3]))

    def _body_row(self, call_id: str) -> tuple[str | None, Any, str | None]:
        row = self._bodies.get(call_id)
        if row is not None:
            return row
        with self._read() as conn:
            found = conn.execute(_BODY_OF, {"b_id": call_id}).first()
        if found is None:
            raise StoreError(
                f"Call {call_id!r}, the base of another call's request body, is missing. "
                "The database is inconsistent."
            )
        return (found[0], found[1], found[2])

    def conversation(self, call_id: str) -> str | None:
        """The call's conversation JSON text. A call whose bodies are stored as edits of its base's
        (store/textdelta.py: request body and conversation, in that order) gets the base's conversation with
        its edit applied; the request bodies are not rebuilt, an export does not read them."""
        cached = self._conversations.get(call_id, _UNREAD)
        if cached is not _UNREAD:
            return cached  # type: ignore[no-any-return]
        chain: list[tuple[str, Any]] = []
        seen: set[str] = set()
        current: str | None = call_id
        text: Any = _UNREAD
        while current is not None:
            text = self._conversations.get(current, _UNREAD)
            if text is not _UNREAD:
                break
            if current in seen:
                raise StoreError(f"Call {current} is its own base (a cycle). The database is inconsistent.")
            seen.add(current)
            base, delta, whole = self._body_row(current)
            if delta is None:
                text = whole
                self._remember(current, text)
                break
            if base is None:
                raise StoreError(f"Call {current} stores its request body as an edit but has no base call.")
            chain.append((current, delta))
            current = base
        keep_from = len(chain) - _FULL_CACHE  # only the texts nearest the call asked for are kept
        for i, (cid, delta) in enumerate(reversed(chain)):
            try:
                pieces = orjson.loads(zlib.decompress(delta))
                if len(pieces) != 2:
                    raise ValueError(f"a stored text edit has {len(pieces)} pieces, expected 2")
                text = textdelta.apply(text, pieces[1])
            except (ValueError, zlib.error) as exc:
                raise StoreError(f"Call {cid}'s stored request body cannot be rebuilt: {exc}.") from exc
            if i >= keep_from:
                self._remember(cid, text)
        return text  # type: ignore[no-any-return]

    def _remember(self, call_id: str, text: str | None) -> None:
        self._conversations[call_id] = text
        while len(self._conversations) > _FULL_CACHE:
            self._conversations.popitem(last=False)

    def full(self, call_id: str) -> bytes:
        """prompt + output of the call as packed IDs: its stored pieces joined, following bases iteratively."""
        cached = self._full.get(call_id)
        if cached is not None:
            return cached
        chain: list[tuple[str, tuple[str | None, int, bytes, bytes]]] = []
        seen: set[str] = set()
        current = call_id
        start: bytes | None = None
        while True:
            if current in seen:
                raise StoreError(
                    f"Call {current} is its own prompt base (a cycle). The database is inconsistent."
                )
            seen.add(current)
            row = self._token_row(current)
            chain.append((current, row))
            base = row[0]
            if base is None:
                break
            start = self._full.get(base)
            if start is not None:
                break
            current = base
        pieces: list[bytes | memoryview] = [start] if start is not None else []
        total = len(start) if start is not None else 0
        for cid, (base, base_len, tail, output) in reversed(chain):
            if base is None:
                if base_len:
                    raise StoreError(f"Call {cid} has prompt_base_len {base_len} but no base call.")
                pieces, total = [], 0
            else:
                keep = base_len * 4
                if keep > total:
                    raise StoreError(
                        f"Call {cid} takes {base_len} tokens from its base call {base}, "
                        f"which has only {total // 4}. The database is inconsistent."
                    )
                while pieces and total - len(pieces[-1]) >= keep:
                    total -= len(pieces.pop())
                if total > keep:
                    last = memoryview(pieces[-1])
                    pieces[-1] = last[: len(last) - (total - keep)]
                    total = keep
            pieces += (tail, output)
            total += len(tail) + len(output)
        out = b"".join(pieces)
        self._full[call_id] = out
        while len(self._full) > _FULL_CACHE:
            self._full.popitem(last=False)
        return out


_UNREAD: Any = object()


class TokenCall:
    """A stored call for an export: the columns a row needs, token arrays rebuilt and bodies parsed on read.

    The attribute names are `Call`'s (records.py), so the reconstruction strategies and the export filters
    read either; `output_ids`, `output_logprobs`, `prompt_ids` and `full_ids()` are numpy arrays (int32,
    float32) over the stored bytes instead of lists. `prompt_len` is known without rebuilding anything."""

    __slots__ = (
        "_completion",
        "_conversation",
        "_episode",
        "_logprobs",
        "_maybe_unsampled",
        "_output",
        "_temperature",
        "backend",
        "backend_kind",
        "dialect",
        "episode_id",
        "extended_from",
        "fidelity",
        "finish_reason",
        "id",
        "model",
        "output_len",
        "prompt_base_call_id",
        "prompt_base_len",
        "prompt_len",
        "recorded_logprob_temperature",
        "render_mode",
        "reward",
        "seq",
        "status",
        "top_k",
        "top_p",
        "weight_version",
        "weight_version_first",
        "weight_version_last",
    )

    def __init__(self, row: Any, episode: _Episode) -> None:
        (
            self.id,
            self.episode_id,
            self.seq,
            self.status,
            self.model,
            self.dialect,
            self.fidelity,
            self.render_mode,
            self.backend,
            self.backend_kind,
            self.finish_reason,
            self.weight_version,
            self.weight_version_first,
            self.weight_version_last,
            self.reward,
            self._temperature,
            self.extended_from,
            self.prompt_base_call_id,
            base_len,
            self.prompt_len,
        ) = row[:20]
        self.prompt_base_len = base_len or 0
        self._output = episode.tokens[self.id][3]
        self.output_len = len(self._output) // 4
        self._logprobs = row[22]
        self._completion = row[23]
        self._conversation = _UNREAD
        self._episode = episode
        self._maybe_unsampled = row[26] < episode.sampling_since
        self.recorded_logprob_temperature, self.top_p, self.top_k = row[27:30]

    @property
    def output_ids(self) -> np.ndarray:
        return np.frombuffer(self._output, dtype=_IDS)

    @property
    def output_logprobs(self) -> np.ndarray:
        """One float32 per output ID, or an empty array when the backend reported none."""
        data = self._logprobs
        if not data:
            return np.zeros(0, dtype=_LOGPROBS)
        if len(data) % 4:
            raise ValueError(f"Packed logprobs must be a multiple of 4 bytes long, got {len(data)} bytes.")
        return np.frombuffer(bytes(data), dtype=_LOGPROBS)

    def full_bytes(self) -> bytes:
        """prompt + output as packed little-endian int32 IDs."""
        full = self._episode.full(self.id)
        if len(full) != (self.prompt_len + self.output_len) * 4:
            raise StoreError(
                f"Call {self.id} records a prompt of {self.prompt_len} tokens but its stored pieces rebuild "
                f"{len(full) // 4 - self.output_len}. The database is inconsistent."
            )
        return full

    def full_ids(self) -> np.ndarray:
        """prompt + output as an int32 array (a view of one buffer)."""
        return np.frombuffer(self.full_bytes(), dtype=_IDS)

    @property
    def prompt_ids(self) -> np.ndarray:
        return self.full_ids()[: self.prompt_len]

    def extends(self, base: TokenCall) -> bool:
        """Whether this call's prompt starts with `base`'s prompt + output (and `base` holds any tokens)."""
        n = base.prompt_len + base.output_len
        if n == 0 or self.prompt_len < n:
            return False
        return memoryview(self.full_bytes())[: n * 4] == base.full_bytes()

    def _conversation_text(self) -> str | None:
        return self._episode.conversation(self.id)

    @property
    def conversation(self) -> dict[str, Any] | None:
        if self._conversation is _UNREAD:
            text = self._conversation_text()
            self._conversation = None if text is None else orjson.loads(text)
        return self._conversation  # type: ignore[no-any-return]

    @property
    def completion(self) -> dict[str, Any] | None:
        return None if self._completion is None else orjson.loads(self._completion)

    @property
    def temperature(self) -> Any:
        """The recorded temperature; for a call recorded before m005 (NULL), its request's own, as
        `Store.iter_calls` gives it. A call started after m005 was applied has its request's temperature in
        the column (NULL: the request named none, call_writes.py), so only older calls read the request."""
        if self._temperature is not None or not self._maybe_unsampled:
            return self._temperature
        if self._conversation is _UNREAD:
            text = self._conversation_text()
            # Every "temperature" key of the (compact, orjson-written) text is null, or there is none: then
            # the request's is None too, known without parsing the whole conversation.
            if text is None or text.count('"temperature":') == text.count('"temperature":null'):
                return None
        conversation = self.conversation
        if conversation:
            return (conversation.get("sampling") or {}).get("temperature")
        return None

    mixed_weight_versions = Call.mixed_weight_versions  # the same properties, over the same attributes
    has_tools = Call.has_tools
    logprob_temperature = Call.logprob_temperature


def _reader(store: Any) -> Any:
    # Store._read: a read transaction under the store's lock (an in-memory SQLite database is one shared
    # connection), its errors as StoreError.
    return store._read


def episode_calls(
    store: Any,
    episode_ids: Sequence[str] | None = None,
    *,
    where: EpisodeQuery | None = None,
) -> list[tuple[str, int]]:
    """(episode ID, number of calls) of the episodes that match, in the order `iter_token_calls` reads them
    (episode start time, then ID); NotFoundError names any of `episode_ids` that is not there."""
    count = select(func.count()).where(C.c.episode_id == E.c.id).scalar_subquery()
    query = select(E.c.id, count).order_by(E.c.started_at, E.c.id)
    if where is not None:
        query = query.where(*where.conditions())
    if episode_ids is not None:
        wanted = list(dict.fromkeys(episode_ids))
        query = query.where(E.c.id.in_(wanted))
    with _reader(store)() as conn:
        ordered = [(eid, n) for eid, n in conn.execute(query)]
    if episode_ids is not None and len(ordered) != len(wanted):
        missing = sorted(set(wanted) - {eid for eid, _ in ordered})
        raise NotFoundError(f"No episode {', '.join(map(repr, missing))}. Run `polarproxy ls` to list them.")
    return ordered


def iter_token_calls(
    store: Any,
    episode_ids: Sequence[str] | None = None,
    *,
    where: EpisodeQuery | None = None,
) -> Iterator[TokenCall]:
    """The calls of the episodes that match (all, exact IDs, `where`), as `Store.iter_calls` orders them.
    Episodes are read together while they hold at most `ROWS_PER_READ` calls in all, and a larger one
    `ROWS_PER_READ` calls at a time; each read is its own short transaction."""
    read = _reader(store)
    with read() as conn:
        since = sampling_recorded_since(conn)
    ordered = episode_calls(store, episode_ids, where=where)
    group: list[str] = []
    size = 0
    for eid, n in ordered:
        if group and size + n > ROWS_PER_READ:
            yield from _read_group(read, group, since)
            group, size = [], 0
        if n > ROWS_PER_READ:
            yield from _read_large(read, eid, since)
            continue
        group.append(eid)
        size += n
    if group:
        yield from _read_group(read, group, since)


def _read_group(read: Any, episode_ids: list[str], since: float) -> Iterator[TokenCall]:
    with read() as conn:
        rows = conn.execute(_GROUP, {"b_episodes": episode_ids}).all()
    by_episode: dict[str, list[Any]] = {eid: [] for eid in episode_ids}
    for row in rows:
        by_episode[row[1]].append(row)
    del rows
    for eid in episode_ids:
        episode = _Episode(read, since)
        for row in by_episode.pop(eid):
            episode.add(row)
            yield TokenCall(row, episode)


def _read_large(read: Any, episode_id: str, since: float) -> Iterator[TokenCall]:
    episode = _Episode(read, since)
    after = -1
    while True:
        with read() as conn:
            rows = conn.execute(_CHUNK, {"b_episode": episode_id, "b_after": after}).all()
        for row in rows:
            episode.add(row)
            yield TokenCall(row, episode)
        if len(rows) < ROWS_PER_READ:
            return
        after = rows[-1][2]
