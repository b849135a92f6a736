"""A resent history is parsed once (polarproxy/dialects/resend.py): each request of an episode reuses the
Messages of the earlier request's identical bytes and parses only the rest. Whatever the bodies, the
result is the whole parse's: the same Conversation, or the same DialectError."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polarproxy.dialects import OPENAI_CHAT, route
from polarproxy.dialects.anthropic import AnthropicMessages
from polarproxy.dialects.base import DialectError
from polarproxy.dialects.resend import ResentBodies, parse_whole

PATH = "/v1/chat/completions"
ANTHROPIC = AnthropicMessages()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_shell_command",
            "description": 'Run a command. Quote with "double" quotes; \\ escapes; [brackets] {braces}.',
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def outcome(bodies: ResentBodies, episode: str, content: bytes, dialect: Any = OPENAI_CHAT) -> Any:
    try:
        return bodies.parse(dialect, episode, content, path=PATH, query={})
    except DialectError as e:
        return ("error", e.message, e.status)


def whole(content: bytes, dialect: Any = OPENAI_CHAT) -> Any:
    try:
        return parse_whole(dialect, content, path=PATH, query={})
    except DialectError as e:
        return ("error", e.message, e.status)


def dump(body: dict[str, Any], style: str = "compact") -> bytes:
    if style == "compact":  # JSON.stringify, orjson
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    if style == "python":  # json.dumps's defaults (Aider)
        return json.dumps(body).encode()
    return json.dumps(body, indent=2).encode()


def turn(i: int) -> list[dict[str, Any]]:
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{i}",
                    "type": "function",
                    "function": {
                        "name": "run_shell_command",
                        "arguments": json.dumps({"command": f"cat f{i}"}),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": f"call_{i}", "content": f'line "{i}" \\ ]}} ü\n' * 20},
    ]


def history(turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " * 10},
        {"role": "user", "content": [{"type": "text", "text": "Fix the test."}]},
    ]
    for i in range(turns):
        msgs += turn(i)
    return msgs


def test_an_agent_loop_parses_each_message_once_and_reuses_the_objects():
    bodies = ResentBodies(min_bytes=0)
    earlier = None
    for n in range(1, 12):
        content = dump({"model": "m", "messages": history(n), "tools": TOOLS, "max_tokens": 64})
        conv = outcome(bodies, "ep", content)
        assert conv == whole(content)
        if earlier is not None:  # every message of the earlier request is the same object
            assert all(a is b for a, b in zip(conv.messages, earlier.messages, strict=False))
            assert conv.tools is earlier.tools  # the members after the messages are the same bytes
        earlier = conv
    # 2 + 2 messages parsed at the first call, then 2 new ones per call
    assert bodies.parsed == 4 + 2 * 10
    assert bodies.reused == sum(2 + 2 * n for n in range(1, 11))


def test_an_edited_message_is_parsed_again_with_everything_after_it():
    bodies = ResentBodies(min_bytes=0)
    msgs = history(6)
    outcome(bodies, "ep", dump({"model": "m", "messages": msgs}))
    edited = [dict(m) for m in msgs]
    edited[5] = {**edited[5], "content": "compacted"}
    before = (bodies.reused, bodies.parsed)
    content = dump({"model": "m", "messages": edited + turn(9)})
    conv = outcome(bodies, "ep", content)
    assert conv == whole(content)
    assert (bodies.reused - before[0], bodies.parsed - before[1]) == (5, len(edited) + 2 - 5)


def test_an_edit_at_the_very_end_of_a_message_is_seen():
    bodies = ResentBodies(min_bytes=0)
    msgs = history(2)
    outcome(bodies, "ep", dump({"model": "m", "messages": msgs}))
    for content in (
        dump({"model": "m", "messages": [*msgs[:-1], {**msgs[-1], "content": msgs[-1]["content"] + "!"}]}),
        dump({"model": "m", "messages": [*msgs[:-1], {**msgs[-1], "name": "x"}]}),
    ):
        assert outcome(bodies, "ep", content) == whole(content)


def test_a_same_length_change_after_the_messages_is_seen():
    bodies = ResentBodies(min_bytes=0)
    outcome(bodies, "ep", dump({"messages": history(2), "model": "m", "max_tokens": 8}))
    content = dump({"messages": history(2), "model": "n", "max_tokens": 9})
    conv = outcome(bodies, "ep", content)
    assert conv == whole(content) and (conv.model, conv.sampling.max_tokens) == ("n", 9)


def test_a_changed_member_before_the_messages_still_reuses_them():
    bodies = ResentBodies(min_bytes=0)
    outcome(bodies, "ep", dump({"model": "m", "user": "a", "messages": history(3), "stream": False}))
    content = dump({"model": "m2", "user": "abc", "messages": history(4), "stream": True})
    conv = outcome(bodies, "ep", content)
    assert conv == whole(content) and conv.model == "m2" and conv.stream
    assert bodies.reused == len(history(3))


def test_episodes_are_kept_apart_and_bounded():
    bodies = ResentBodies(min_bytes=0, max_episodes=2)
    for ep in ("a", "b", "c"):
        outcome(bodies, ep, dump({"model": ep, "messages": history(2)}))
    content = dump({"model": "a", "messages": history(3)})
    assert outcome(bodies, "a", content) == whole(content)
    assert bodies.reused == 0  # 'a' was forgotten (the oldest of three)
    content = dump({"model": "c", "messages": history(3)})
    assert outcome(bodies, "c", content) == whole(content)
    assert bodies.reused == len(history(2))


def test_interleaved_conversations_of_one_episode_each_reuse_their_own():
    """A harness's subagent runs its own conversation in the same episode, between the main agent's calls."""
    bodies = ResentBodies(min_bytes=0)
    other = [
        {"role": "system", "content": "You are a search subagent."},
        {"role": "user", "content": "Find x."},
    ]
    for n in range(1, 6):
        for msgs in (history(n), other + [m for i in range(n) for m in turn(100 + i)]):
            content = dump({"model": "m", "messages": msgs, "tools": TOOLS})
            assert outcome(bodies, "ep", content) == whole(content)
    # each conversation's first request is parsed whole (2 + 2 messages each), then 2 new messages a call
    assert bodies.parsed == 2 * (4 + 2 * 4)
    single = ResentBodies(min_bytes=0, per_episode=1)  # one body an episode: each request misses
    for n in range(1, 4):
        for msgs in (history(n), other + [m for i in range(n) for m in turn(100 + i)]):
            outcome(single, "ep", dump({"model": "m", "messages": msgs, "tools": TOOLS}))
    assert single.reused == 0


def test_the_bodies_kept_are_bounded_in_bytes():
    content = dump({"model": "m", "messages": history(4)})
    bodies = ResentBodies(min_bytes=0, max_bytes=2 * len(content) + 10)
    for ep in ("a", "b", "c", "d"):
        outcome(bodies, ep, content)
        assert bodies.bytes_kept <= bodies.max_bytes
    assert bodies.bytes_kept == 2 * len(content)  # the two latest episodes
    outcome(bodies, "d", dump({"model": "m", "messages": history(5)}))
    assert bodies.reused == len(history(4))
    outcome(bodies, "a", dump({"model": "m", "messages": history(5)}))
    assert bodies.reused == len(history(4))  # 'a' was forgotten


def test_small_bodies_are_parsed_whole():
    bodies = ResentBodies()  # the default threshold
    content = dump({"model": "m", "messages": history(1)})
    assert len(content) < bodies.min_bytes
    assert outcome(bodies, "ep", content) == whole(content)
    assert (bodies.reused, bodies.parsed) == (0, 0)


HOSTILE = [
    # a duplicate messages key after the array: JSON's last one wins, as in the whole parse
    b'{"model":"m","messages":[SYS,USER],"messages":[USER]}',
    # the same, spelled with an escape
    b'{"model":"m","messages":[SYS,USER],"m\\u0065ssages":[USER]}',
    # the array is the first member, then the only one
    b'{"messages":[SYS,USER],"model":"m"}',
    b'{"messages":[SYS,USER]}',
    b'{ "messages" : [ SYS , USER ] , "model" : "m" }',
    # an element that is not an object, an array that is not one, no messages at all
    b'{"model":"m","messages":[SYS,"user"]}',
    b'{"model":"m","messages":[SYS,[USER]]}',
    b'{"model":"m","messages":{"role":"user"}}',
    b'{"model":"m","messages":[]}',
    b'{"model":"m"}',
    # broken JSON in the new part, after it, and a body that is not an object
    b'{"model":"m","messages":[SYS,USER,{"role":"user","content":"a}]}',
    b'{"model":"m","messages":[SYS,USER],"tools":[}',
    b'{"model":"m","messages":[SYS,USER]}trailing',
    b'[{"model":"m","messages":[SYS,USER]}]',
    # a message the dialect refuses, among reused ones; a member the dialect refuses
    b'{"model":"m","messages":[SYS,USER,{"role":"wizard","content":"x"}]}',
    b'{"model":"m","messages":[SYS,USER],"n":3}',
    # strings with brackets, braces, escaped quotes and backslashes at their ends
    b'{"model":"m","messages":[SYS,USER,{"role":"user","content":"]}\\"\\\\"}]}',
]
SYS = json.dumps({"role": "system", "content": "x" * 100}).encode()
USER = json.dumps({"role": "user", "content": 'hello [world] {"q"}'}).encode()


@pytest.mark.parametrize("dialect", [OPENAI_CHAT, ANTHROPIC], ids=["openai_chat", "anthropic"])
@pytest.mark.parametrize("template", HOSTILE)
def test_hostile_shapes_get_the_whole_parse_answer(template: bytes, dialect: Any):
    def body(text: bytes) -> bytes:
        text = text.replace(b"SYS", SYS).replace(b"USER", USER)
        return text.replace(b'"model":"m"', b'"model":"m","max_tokens":8') if dialect is ANTHROPIC else text

    content = body(template)
    fresh = ResentBodies(min_bytes=0)
    assert outcome(fresh, "ep", content, dialect) == whole(content, dialect)
    # and after a well-formed request whose bytes share its beginning
    primed = ResentBodies(min_bytes=0)
    outcome(primed, "ep", body(b'{"model":"m","messages":[SYS,USER]}'), dialect)
    assert outcome(primed, "ep", content, dialect) == whole(content, dialect)
    # and again after it (what it left behind, if anything, holds)
    follow = body(b'{"model":"m","messages":[SYS,USER,USER]}')
    assert outcome(primed, "ep", follow, dialect) == whole(follow, dialect)


def test_captured_harness_requests_parse_as_whole(traffic):
    for harness in ("qwen", "opencode", "pi", "aider", "claude", "claude-authtoken", "pi-anth"):
        bodies = ResentBodies(min_bytes=0)
        earlier = None
        shared_tools = 0
        for row in traffic(harness):
            dialect = route(row["method"], row["path"].partition("?")[0])
            assert dialect is not None and dialect.name in ("openai_chat", "anthropic")
            content = dump(row["body"], "python" if harness == "aider" else "compact")
            conv = outcome(bodies, harness, content, dialect)
            assert conv == whole(content, dialect), harness
            shared_tools += earlier is not None and bool(conv.tools) and conv.tools is earlier.tools
            earlier = conv
        if harness in ("qwen", "opencode", "pi"):  # later requests resend earlier messages
            assert bodies.reused > 0, harness
        # Claude Code and Pi over Anthropic move their cache breakpoint off the first request's only user
        # message, so the second shares no whole message with it (a longer loop does: the test below); Claude
        # Code's third request shares the tools (~74 KB of its 87 KB)
        if harness == "claude":
            assert shared_tools == 1


def claude_request(turns: int) -> dict[str, Any]:
    """Claude Code's shape: system blocks, tools, and a cache breakpoint on the last message, which moves
    to the new last message with every request."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "Fix the test."}]}
    ]
    for i in range(turns):
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": f"Look at f{i}.", "signature": f"sig{i}"},
                    {
                        "type": "tool_use",
                        "id": f"toolu_{i}",
                        "name": "Bash",
                        "input": {"command": f"cat f{i}"},
                    },
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"x{i}" * 50}],
            }
        )
    last = messages[-1]["content"][-1]
    messages[-1] = {
        **messages[-1],
        "content": [*messages[-1]["content"][:-1], {**last, "cache_control": {"type": "ephemeral"}}],
    }
    return {
        "model": "claude",
        "messages": messages,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "Bash", "description": "Run a command.", "input_schema": {"type": "object"}}],
        "max_tokens": 32000,
        "stream": True,
    }


def test_an_anthropic_loop_reuses_all_but_the_message_whose_cache_breakpoint_moved():
    bodies = ResentBodies(min_bytes=0)
    earlier = None
    for n in range(1, 8):
        content = dump(claude_request(n))
        conv = outcome(bodies, "ep", content, ANTHROPIC)
        assert conv == whole(content, ANTHROPIC)
        assert conv.messages[0].role == "system"
        if earlier is not None:  # the system prompt, then every message before the earlier last one
            same = len(earlier.messages) - 1
            assert all(a is b for a, b in zip(conv.messages[:same], earlier.messages, strict=False))
            assert conv.messages[same] is not earlier.messages[same]
            assert conv.tools is earlier.tools
        earlier = conv
    assert bodies.reused == sum(2 * (n - 1) for n in range(2, 8))  # all but the earlier last element


# -- any sequence of requests -----------------------------------------------------------------------

MESSAGE = st.one_of(
    st.builds(
        lambda role, text: {"role": role, "content": text},
        st.sampled_from(["system", "user", "tool", "assistant", "wizard"]),
        st.text(alphabet=st.sampled_from('ab"\\]}[{ \nü\x00'), max_size=12),
    ).map(lambda m: {**m, "tool_call_id": "c1"} if m["role"] == "tool" else m),
    st.builds(lambda i: turn(i)[0], st.integers(0, 3)),
    st.just({"role": "user"}),  # no content: refused
    st.just("not an object"),
)
EDIT = st.one_of(
    st.tuples(st.just("append"), st.lists(MESSAGE, min_size=0, max_size=3)),
    st.tuples(st.just("replace"), st.integers(0, 8), MESSAGE),
    st.tuples(st.just("drop"), st.integers(0, 8)),
    st.tuples(st.just("member"), st.sampled_from(["model", "stream", "max_tokens", "tools", "n"])),
    st.tuples(st.just("style"), st.sampled_from(["compact", "python", "indent"])),
    st.tuples(st.just("order"), st.permutations(["model", "messages", "tools", "stream"])),
)
# each member's two values, some of the same length (the same size of body, other bytes)
VALUES = {
    "model": ["m", "n"],
    "stream": [True, False],
    "max_tokens": [8, 9],
    "tools": [TOOLS, []],
    "n": [1, 2],
}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(EDIT, min_size=1, max_size=8), st.booleans())
def test_any_sequence_of_requests_parses_as_whole(edits, two_episodes):
    bodies = ResentBodies(min_bytes=0)
    msgs: list[Any] = history(2)
    members: dict[str, Any] = {"model": "m", "tools": TOOLS, "stream": False}
    order, style = ["model", "messages", "tools", "stream"], "compact"
    flips: dict[str, int] = {}
    for step, edit in enumerate(edits):
        kind = edit[0]
        if kind == "append":
            msgs = msgs + edit[1]
        elif kind == "replace" and msgs:
            msgs = [*msgs[: edit[1] % len(msgs)], edit[2], *msgs[edit[1] % len(msgs) + 1 :]]
        elif kind == "drop" and msgs:
            msgs = msgs[: edit[1] % len(msgs)] + msgs[edit[1] % len(msgs) + 1 :]
        elif kind == "member":
            flips[edit[1]] = flips.get(edit[1], 0) + 1
            members[edit[1]] = VALUES[edit[1]][flips[edit[1]] % 2]
        elif kind == "style":
            style = edit[1]
        elif kind == "order":
            order = list(edit[1])
        body = {k: msgs if k == "messages" else members[k] for k in order if k == "messages" or k in members}
        body.update({k: v for k, v in members.items() if k not in body})
        content = dump(body, style)
        episode = "b" if two_episodes and step % 2 else "a"
        assert outcome(bodies, episode, content) == whole(content)
