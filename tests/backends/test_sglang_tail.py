"""Cumulative SGLang streams read by their new elements only (backends/sglang_tail.py): the same
generations as whole parses, against the SGLang double and on hand-made events; what the shortcut cannot
read is parsed whole, and a last event that disagrees fails the call."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from sglang_double import SGLangDouble

from polarproxy.backends import sglang
from polarproxy.backends.base import BackendError, GenerateParams
from polarproxy.backends.sglang import SGLangBackend
from polarproxy.backends.sglang_tail import cumulative_tail

EOS = 7
LONG = [100 + (i * 37) % 800 for i in range(400)] + [EOS]  # events grow past MIN_EVENT_CHARS


def _tuples(gens: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (
            list(g.output_ids),
            list(g.logprobs),
            list(g.new_ids),
            g.finish_reason,
            g.matched_stop,
            g.weight_version,
        )
        for g in gens
    ]


async def _stream(url: str) -> list[Any]:
    backend = SGLangBackend(url)
    try:
        params = GenerateParams(max_new_tokens=1000, stop_token_ids=[EOS])
        return [g async for g in backend.generate([1, 2, 3], params, stream=True)]
    finally:
        await backend.aclose()


@pytest.mark.parametrize("incremental", [False, True])
async def test_streams_read_by_their_tails_give_what_whole_parses_give(monkeypatch, incremental):
    used: list[int] = []
    real = sglang.cumulative_tail

    def counting(data: str, have: int) -> Any:
        got = real(data, have)
        used.append(got is not None)
        return got

    monkeypatch.setattr(sglang, "cumulative_tail", counting)
    with SGLangDouble(outputs=LONG, eos_token_ids=frozenset({EOS})) as d:
        d.incremental_streaming_output = incremental
        fast = await _stream(d.url)
        monkeypatch.setattr(sglang, "MIN_EVENT_CHARS", 10**9)  # every event parsed whole
        whole = await _stream(d.url)
    assert _tuples(fast) == _tuples(whole)
    assert fast[-1].output_ids == LONG and fast[-1].finish_reason == "stop"
    assert [g.new_ids for g in fast] == [[t] for t in LONG]
    if incremental:  # its events stay short: never long enough for the shortcut
        assert not any(used)
    else:
        assert len(used) > 200 and all(used)  # the long events were read by their tails


def _event(ids: list[int], *, completion: int | None = None, text: str = "", finish: Any = None) -> str:
    return orjson.dumps(
        {
            "text": text,
            "output_ids": ids,
            "meta_info": {
                "id": "r",
                "finish_reason": finish,
                "prompt_tokens": 3,
                "completion_tokens": len(ids) if completion is None else completion,
                "weight_version": "w",
                "output_token_logprobs": [[-0.5 - i / 1000, t, None] for i, t in enumerate(ids)],
            },
        }
    ).decode()


@pytest.mark.parametrize("have", [0, 1, 5, 9, 10])
def test_the_tail_is_the_elements_after_those_already_read(have):
    ids = list(range(500, 510))
    rest, new_ids, triples = cumulative_tail(_event(ids, text='quote " "output_ids":[1,2] and ]]'), have)
    whole = orjson.loads(_event(ids))
    assert new_ids == ids[have:]
    assert triples == whole["meta_info"]["output_token_logprobs"][have:]
    assert rest["meta_info"]["completion_tokens"] == 10 and rest["meta_info"]["weight_version"] == "w"
    assert rest["text"] == 'quote " "output_ids":[1,2] and ]]'  # a key's text inside a string is no key
    assert rest["output_ids"] == [] and rest["meta_info"]["output_token_logprobs"] == []


def test_an_empty_answer_so_far_is_read():
    rest, new_ids, triples = cumulative_tail(_event([]), 0)
    assert (new_ids, triples, rest["meta_info"]["completion_tokens"]) == ([], [], 0)


@pytest.mark.parametrize(
    "data, have, why",
    [
        (_event([1, 2, 3], completion=7), 0, "an incremental server's event (counts differ)"),
        (_event([1, 2, 3]), 4, "fewer elements than already read"),
        (_event([1, 2]).replace('"id":"r"', '"id":"r","output_ids":[9]'), 0, "a key twice"),
        (_event([1, 2]).replace("null]", '"[x]"]'), 0, "a triple's text with brackets"),
        (_event([1, 2]).replace('"output_token_logprobs"', '"other"'), 0, "no triples"),
        ('{"error": {"message": "boom"}}', 0, "an error event"),
    ],
)
def test_what_the_tail_cannot_read_is_left_to_a_whole_parse(data, have, why):
    assert cumulative_tail(data, have) is None, why


class _Events:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        for e in self.events:
            yield f"data: {e}\n\n".encode()
        yield b"data: [DONE]\n\n"

    async def finish(self) -> None:
        pass


async def _read(events: list[str]) -> list[Any]:
    backend = SGLangBackend.__new__(SGLangBackend)
    backend.url = "http://127.0.0.1:1"
    return [g async for g in backend._read_stream(_Events(events))]  # type: ignore[arg-type]


async def test_a_last_event_that_disagrees_with_the_tails_fails_the_call(monkeypatch):
    monkeypatch.setattr(sglang, "MIN_EVENT_CHARS", 0)
    ids = list(range(300, 340))
    events = [_event(ids[:k]) for k in range(1, len(ids))]
    gens = await _read([*events, _event(ids, finish={"type": "stop", "matched": 7})])
    assert gens[-1].output_ids == ids and gens[-1].finish_reason == "stop"
    changed = [*ids[:5], 999, *ids[6:]]  # an earlier token differs in the last event
    with pytest.raises(BackendError, match="disagrees with the events before it"):
        await _read([*events, _event(changed, finish={"type": "stop", "matched": 7})])


async def test_an_incremental_stream_with_a_long_first_event_is_read_as_deltas(monkeypatch):
    """An incremental server's first event looks cumulative (it holds every token so far) and may be read by
    its tail; the events after it hold only new tokens and are parsed whole, with no prefix to compare."""
    monkeypatch.setattr(sglang, "MIN_EVENT_CHARS", 0)
    ids = list(range(300, 340))
    events = [_event(ids[:30])] + [
        _event([t], completion=k + 1) for k, t in enumerate(ids) if k >= 30 and k < len(ids) - 1
    ]
    events.append(_event([ids[-1]], completion=len(ids), finish={"type": "length"}))
    gens = await _read(events)
    assert gens[-1].output_ids == ids and gens[-1].finish_reason == "length"
    assert [g.new_ids for g in gens] == [ids[:30], *[[t] for t in ids[30:]]]
