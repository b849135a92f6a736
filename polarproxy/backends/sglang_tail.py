"""Reading SGLang's cumulative stream in time linear in each event's bytes, not in its values.

SGLang streams cumulatively unless its server runs with `--incremental-streaming-output`: every event of
`POST /generate` repeats all output IDs and `[logprob, id, text]` triples so far. Parsing each event whole
makes Python objects for every value again, so one answer of n tokens costs n²/2 of them: measured here,
~7 s of proxy CPU to read one 4,096-token answer, against ~0.09 s for the same answer streamed
incrementally (docs/benchmarks-history.md).

`cumulative_tail(data, have)` finds the two arrays with string searches (C speed, no object per value),
parses only the elements after the first `have` and the event with both arrays cut out, and hands back
what a whole parse would give for the new tokens. It declines (None) whatever it cannot read that way:
a key that is not there exactly once, an array of another shape (a triple's text holding a bracket), counts
that do not match `completion_tokens` (an incremental server), fewer elements than already read. The
caller then parses the event whole, and parses the last event of a stream whole in any case, comparing
what it accumulated with it (`SGLangBackend._read_stream`), so a misread can fail a call but never be
recorded.

Why a key search cannot be fooled by text: inside a JSON string every `"` is escaped, so `"output_ids":[`
with an unescaped quote before the colon only occurs where a string ends and a colon follows, that is, at
a key; and each key must occur exactly once in the event.
"""

from __future__ import annotations

from typing import Any

import orjson

IDS_KEY = '"output_ids":['
TRIPLES_KEY = '"output_token_logprobs":['
MIN_EVENT_CHARS = 4096  # shorter events are parsed whole: a whole parse is as cheap there


def _array(data: str, key: str, close: str) -> tuple[int, int] | None:
    """(index of the array's `[`, index of its `]`) for the key that occurs exactly once; `close` is what
    ends the array (`]` for IDs, `]]` for triples, whose elements hold no other bracket: `cumulative_tail`
    counts them)."""
    at = data.find(key)
    if at < 0 or data.find(key, at + 1) >= 0:
        return None
    start = at + len(key) - 1
    if data.startswith("[]", start):
        return start, start + 1
    end = data.find(close, start)
    if end < 0:
        return None
    return start, end + len(close) - 1


def cumulative_tail(data: str, have: int) -> tuple[dict[str, Any], list[int], list[list[Any]]] | None:
    """(the event without its two arrays, the output IDs after the first `have`, their triples), or None
    when the event is not a cumulative one this can read (see the module's docstring)."""
    ids_at = _array(data, IDS_KEY, "]")
    triples_at = _array(data, TRIPLES_KEY, "]]")
    if ids_at is None or triples_at is None:
        return None
    (i0, i1), (t0, t1) = ids_at, triples_at
    if i0 < t0 < i1 or t0 < i0 < t1:
        return None
    n = 0 if i1 == i0 + 1 else data.count(",", i0, i1) + 1
    n_triples = data.count("[", t0 + 1, t1)
    if n_triples != n or n < have:
        return None  # not one [logprob, id, text] triple per ID, or a text that holds a bracket
    new = n - have
    first = i1  # the comma before the first new ID (or the array's `[`)
    for _ in range(new):
        first = data.rfind(",", i0, first)
        if first < 0:
            first = i0
            break
    first_triple = t1  # the `[` of the first new triple
    for _ in range(new):
        first_triple = data.rfind("[", t0 + 1, first_triple)
    try:
        new_ids = orjson.loads("[" + data[first + 1 : i1] + "]") if new else []
        new_triples = orjson.loads("[" + data[first_triple:t1] + "]") if new else []
        cuts = sorted(((i0, i1), (t0, t1)))
        rest = orjson.loads(
            data[: cuts[0][0]] + "[]" + data[cuts[0][1] + 1 : cuts[1][0]] + "[]" + data[cuts[1][1] + 1 :]
        )
    except orjson.JSONDecodeError:
        return None
    meta = rest.get("meta_info") if isinstance(rest, dict) else None
    if not isinstance(meta, dict) or meta.get("completion_tokens") != n:
        return None  # an incremental server, or the arrays were not where SGLang puts them
    if len(new_ids) != new or len(new_triples) != new:
        return None
    return rest, new_ids, new_triples
