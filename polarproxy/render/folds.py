"""Folds: how a conversation is reshaped for a chat template that refuses it as it stands.

Harnesses send system text where many templates do not accept it: Codex sends its system prompt and a
second `developer` item (both become system messages), Claude Code sends a `role: "system"` message
inside `messages` besides the top-level system; the Mistral template accepts only one system message,
first, and strictly alternating user/assistant roles. The renderer first renders a conversation as it
stands; only when the template raises does it apply the folds below, in order, each on top of the ones
before, until the template accepts the result (`Renderer.render_folded`). The fold used is recorded with
the prompt.

1. `system-merged`: the system messages before the first other message become one system message, their
   texts joined with a blank line.
2. `system-into-user`: every later system message is appended (after a blank line) to the nearest user
   message before it; with none before it, it joins the leading system message.
3. `users-joined`: consecutive user messages become one, texts joined with a blank line.

Every fold looks only backwards: the folded form of a conversation's first k messages does not depend
on the messages after them, so the tokens of earlier turns stay the same from call to call (T2 can
extend). A system message that arrives *after* the answer being extended folds into a user message
before that answer; such a call is rendered fresh, with the reason recorded.
"""

from __future__ import annotations

from dataclasses import replace

from polarproxy.conversation import Message

FOLDS = ("system-merged", "system-into-user", "users-joined")
SEPARATOR = "\n\n"


def fold_name(level: int) -> str | None:
    """The recorded name of fold `level` (0: none; 2: 'system-merged+system-into-user')."""
    return "+".join(FOLDS[:level]) or None


def fold_level(name: str | None) -> int:
    """The level of a recorded fold name (the inverse of `fold_name`)."""
    return 0 if not name else len(name.split("+"))


def _leading_systems(messages: list[Message]) -> int:
    n = 0
    while n < len(messages) and messages[n].role == "system":
        n += 1
    return n


def _merge(into: Message, extra: str) -> Message:
    return replace(into, content=into.content + SEPARATOR + extra if into.content else extra)


def merge_leading_systems(messages: list[Message]) -> list[Message]:
    lead = _leading_systems(messages)
    if lead < 2:
        return messages
    text = SEPARATOR.join(m.content for m in messages[:lead])
    return [Message(role="system", content=text), *messages[lead:]]


def systems_into_users(messages: list[Message]) -> list[Message]:
    lead = _leading_systems(messages)
    out = list(messages[:lead])
    for m in messages[lead:]:
        if m.role != "system":
            out.append(m)
            continue
        for j in range(len(out) - 1, -1, -1):
            if out[j].role == "user":
                out[j] = _merge(out[j], m.content)
                break
        else:
            if out and out[0].role == "system":
                out[0] = _merge(out[0], m.content)
            else:
                out.insert(0, Message(role="system", content=m.content))
    return out


def join_users(messages: list[Message]) -> list[Message]:
    out: list[Message] = []
    for m in messages:
        if m.role == "user" and out and out[-1].role == "user" and not out[-1].tool_calls:
            out[-1] = _merge(out[-1], m.content)
        else:
            out.append(m)
    return out


STEPS = (merge_leading_systems, systems_into_users, join_users)


def fold(messages: list[Message], level: int) -> list[Message]:
    """`messages` with the first `level` folds applied (a new list; the messages are not modified)."""
    if not 0 <= level <= len(STEPS):
        raise ValueError(f"Fold level {level} is out of range: must be 0..{len(STEPS)}.")
    out = list(messages)
    for step in STEPS[:level]:
        out = step(out)
    return out
