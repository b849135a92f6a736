from polarproxy.sse import Event, SSEDecoder, encode

STREAM = (
    b": keep-alive\n\n"
    b'data: {"a": 1}\n\n'
    b'event: message_start\r\ndata: {"type": "message_start"}\r\n\r\n'
    b"data: first line\ndata: second line\n\n"
    b"id: 7\rdata: caf\xc3\xa9 \xe2\x9c\x93\r\r"
    b"data:no-space\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    Event(data='{"a": 1}'),
    Event(data='{"type": "message_start"}', event="message_start"),
    Event(data="first line\nsecond line"),
    Event(data="caf\u00e9 \u2713", id="7"),
    Event(data="no-space", id="7"),
    Event(data="[DONE]", id="7"),
]


def decode_all(chunks: list[bytes]) -> list[Event]:
    dec = SSEDecoder()
    out: list[Event] = []
    for c in chunks:
        out += dec.decode(c)
    return out + dec.flush()


def test_sse_whole_stream_decodes_to_expected_events():
    assert decode_all([STREAM]) == EXPECTED


def test_sse_event_split_at_every_byte_offset():
    for i in range(len(STREAM) + 1):
        assert decode_all([STREAM[:i], STREAM[i:]]) == EXPECTED, i


def test_sse_byte_by_byte():
    assert decode_all([STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED


def test_sse_unterminated_last_event_is_not_dispatched():
    assert decode_all([b"data: a\n\ndata: b"]) == [Event(data="a")]


def test_sse_encode_round_trips():
    raw = encode(b'{"x":1}') + encode("y", event="ping")
    assert decode_all([raw]) == [Event(data='{"x":1}'), Event(data="y", event="ping")]
