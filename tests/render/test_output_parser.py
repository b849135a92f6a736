import itertools

import pytest

from polarproxy.conversation import ReasoningDelta, TextDelta, ToolCallDelta, ToolCallEvent
from polarproxy.render.output_parser import OutputParser, parse_output


def ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


CASES = {
    "plain": ("Hello there.", None, "Hello there.", []),
    "reasoning_then_text": (
        "<think>\nLet me see.\n</think>\n\nThe answer is 4.",
        "Let me see.",
        "The answer is 4.",
        [],
    ),
    "tool_call": (
        '<tool_call>\n{"name": "list_files", "arguments": {"path": "."}}\n</tool_call>',
        None,
        "",
        [("list_files", '{"path": "."}')],
    ),
    "text_and_two_calls": (
        'Checking.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n'
        '{"name": "b", "arguments": "{\\"k\\": 1}"}\n</tool_call>',
        None,
        "Checking.",
        [("a", "{}"), ("b", '{"k": 1}')],
    ),
    "broken_call_is_text": (
        "<tool_call>\n{not json}\n</tool_call>",
        None,
        "<tool_call>\n{not json}\n</tool_call>",
        [],
    ),
    "unclosed_call_is_text": ('<tool_call>\n{"name": "a"', None, '<tool_call>\n{"name": "a"', []),
    "unclosed_think_is_reasoning": ("<think>\nstill thinking", "still thinking", "", []),
    "almost_a_tag": ("a < b and <thin ice>", None, "a < b and <thin ice>", []),
    "empty_reasoning": ("<think>\n\n</think>\n\nDone.", "", "Done.", []),
}


def collect(pieces):
    parser = OutputParser(new_call_id=ids())
    events = []
    for p in pieces:
        events += parser.feed(p)
    tail, completion = parser.finish("stop")
    return events + tail, completion


@pytest.mark.parametrize("name", CASES)
def test_parse_whole_text(name):
    text, reasoning, content, calls = CASES[name]
    c = parse_output(text, new_call_id=ids())
    assert c.reasoning == reasoning
    assert c.text == content
    assert [(t.name, t.arguments) for t in c.tool_calls] == calls
    assert c.finish_reason == ("tool_calls" if calls else "stop")


@pytest.mark.parametrize("name", CASES)
def test_streamed_deltas_add_up_to_the_whole_parse_at_every_split(name):
    text = CASES[name][0]
    whole = parse_output(text, new_call_id=ids())
    for size in (1, 2, 3, 7):
        pieces = [text[i : i + size] for i in range(0, len(text), size)]
        events, c = collect(pieces)
        assert c == whole
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == whole.text
        streamed_reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
        assert streamed_reasoning == (whole.reasoning or "")
        assert [e.call for e in events if isinstance(e, ToolCallEvent)] == whole.tool_calls


def test_text_is_not_streamed_past_a_partial_tag():
    parser = OutputParser(new_call_id=ids())
    assert parser.feed("Look <tool") == [TextDelta("Look")]
    events = parser.feed('_call>\n{"name": "x", "arguments": {}}\n</tool_call>')
    assert [type(e) for e in events] == [ToolCallDelta, ToolCallDelta, ToolCallEvent]
    assert [e.arguments for e in events if isinstance(e, ToolCallDelta)] == ["", "{}"]


def test_length_finish_is_kept_even_with_a_tool_call():
    c = parse_output(
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>', new_call_id=ids(), finish_reason="length"
    )
    assert c.finish_reason == "length"


def test_the_decoder_gives_the_same_completion_token_by_token_as_at_once(tiny_model_dir):
    from polarproxy.render.decoder import output_decoder
    from polarproxy.render.family import OutputFormat
    from polarproxy.render.renderer import Renderer

    r = Renderer(tiny_model_dir)
    text = '<think>\nhmm ✓\n</think>\n\nOk 日本.\n<tool_call>\n{"name": "ls", "arguments": {"p": "é"}}\n</tool_call>END more'
    token_ids = r.encode(text)
    fmt = OutputFormat(tool="hermes", reasoning="think")

    def decoder():
        return output_decoder(r.decode, fmt, stops=["END"], tools=[], new_call_id=ids())

    whole = decoder()
    whole.push(token_ids)
    _, expected = whole.flush("stop")
    d = decoder()
    events = [e for t in token_ids for e in d.push([t])]
    tail, c = d.flush("stop")
    assert c == expected
    assert (c.reasoning, c.text, [(t.name, t.arguments) for t in c.tool_calls]) == (
        "hmm ✓",
        "Ok 日本.",
        [("ls", '{"p": "é"}')],
    )
    assert "".join(e.text for e in events + tail if isinstance(e, TextDelta)) == c.text


def test_a_prompt_that_opens_think_makes_the_decoder_start_in_reasoning():
    from polarproxy.render.decoder import output_decoder
    from polarproxy.render.family import OutputFormat

    def decode(ids_):
        return "".join(chr(i) for i in ids_)

    think = OutputFormat(tool="hermes", reasoning="think")
    d = output_decoder(
        decode, think, stops=[], tools=[], new_call_id=ids(), prompt_tail="assistant\n<think>\n"
    )
    d.push([ord(ch) for ch in "why\n</think>\n\nbecause"])
    _, c = d.flush("stop")
    assert (c.reasoning, c.text) == ("why", "because")
    none = OutputFormat(tool="hermes", reasoning="none")
    d = output_decoder(decode, none, stops=[], tools=[], new_call_id=ids(), prompt_tail="<think>\n")
    d.push([ord(ch) for ch in "why</think>"])
    assert d.flush("stop")[1].text == "why</think>"
