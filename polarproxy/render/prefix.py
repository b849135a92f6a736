"""T2: prefix-preserving prompts. A call that extends an earlier call of its episode is prompted with
`earlier prompt IDs + earlier output IDs + render(new messages)`, so the model always sees its own
sampled tokens: nothing it sampled is re-tokenized, and templates that drop old reasoning (Qwen3) or
harnesses that re-serialize tool arguments cannot make the context drift.

An earlier call is extended when the new request repeats its messages exactly, then carries the
assistant turn it returned (recognised by tool call IDs, the answer's signature, or its exact text and
reasoning), then only new messages, with the same tools. Otherwise the prompt is rendered fresh, and the
reason is recorded.

The new messages are rendered with the chat template after a stand-in turn whose assistant content is a
sentinel: the text after the sentinel is exactly what the template writes after an assistant turn (the
end-of-turn tokens, tool-response wrapping, the generation prompt), computed without rendering or
tokenizing anything that came before.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass

from polarproxy.conversation import Completion, Conversation, Message
from polarproxy.render.renderer import Renderer

SENTINEL = "polarproxy-sentinel-6c1f0e"
# Memory bound for `serve` with many episodes: token IDs are kept as int32 arrays (~4 bytes a token);
# the conversations are the bulk (a Qwen Code request is ~78 KB of text).
MAX_EPISODES = 256
CALLS_PER_EPISODE = 8


@dataclass(slots=True, frozen=True)
class Turn:
    """A finished call that later calls may extend."""

    call_id: str
    conversation: Conversation
    completion: Completion
    prompt_ids: array[int]  # int32
    output_ids: array[int]
    closing_text: str | None  # the text of the stop token that ended the output, None if cut by length


@dataclass(slots=True)
class Prompt:
    ids: list[int]
    mode: str  # 'fresh' | 'extended'
    extended_from: str | None = None
    note: str | None = None  # why a call was rendered fresh where an earlier call existed


def is_returned_turn(sent: Message, completion: Completion) -> bool:
    """Whether the harness's assistant message is the answer polarproxy returned."""
    if sent.role != "assistant":
        return False
    if completion.tool_calls:
        if [t.id for t in sent.tool_calls] == [t.id for t in completion.tool_calls]:
            return True
        # the answer's signature outlives tool call IDs that a harness drops (Pi over Gemini)
        return bool(completion.signature) and sent.signature == completion.signature
    if completion.signature and sent.signature:
        return sent.signature == completion.signature
    return sent.content.strip() == completion.text.strip() and not sent.tool_calls


def _mismatch(conv: Conversation, turn: Turn) -> str | None:
    """None when `conv` extends `turn`; else why not."""
    prev = turn.conversation
    n = len(prev.messages)
    if len(conv.messages) <= n + 1:
        return f"the request has no new messages after call {turn.call_id}'s answer"
    if conv.tools != prev.tools:
        return f"the tools differ from call {turn.call_id}'s"
    for i, (a, b) in enumerate(zip(conv.messages, prev.messages, strict=False)):
        if a != b:
            return f"message {i} differs from call {turn.call_id}'s (edited history, compaction or a changed system prompt)"
    if not is_returned_turn(conv.messages[n], turn.completion):
        return f"message {n} is not the assistant turn call {turn.call_id} returned"
    if any(m.role == "assistant" for m in conv.messages[n + 1 :]):
        return "the new messages hold an assistant turn polarproxy did not sample"
    return None


class PrefixIndex:
    """Recent finished calls per episode, in memory (one proxy process serves an episode)."""

    def __init__(self, renderer: Renderer) -> None:
        self.renderer = renderer
        self._episodes: OrderedDict[str, list[Turn]] = OrderedDict()
        self._stand_in_text: str | None = None  # the stand-in turn rendered alone: the same for every call

    def remember(self, episode_id: str, turn: Turn) -> None:
        turns = self._episodes.setdefault(episode_id, [])
        self._episodes.move_to_end(episode_id)
        turns.append(turn)
        del turns[:-CALLS_PER_EPISODE]
        while len(self._episodes) > MAX_EPISODES:
            self._episodes.popitem(last=False)

    def build(self, episode_id: str, conv: Conversation) -> Prompt:
        """The prompt for `conv`: extending the most recent call it extends, else rendered fresh."""
        turns = self._episodes.get(episode_id, [])
        note = None
        for turn in sorted(turns, key=lambda t: len(t.conversation.messages), reverse=True):
            why = _mismatch(conv, turn)
            if why is None:
                tail = self.tail(conv.messages[len(turn.conversation.messages) + 1 :], turn.closing_text)
                if tail is not None:
                    ids = [*turn.prompt_ids, *turn.output_ids, *self.renderer.encode(tail)]
                    return Prompt(ids=ids, mode="extended", extended_from=turn.call_id)
                why = (
                    "the chat template does not close the earlier answer with the stop token the model "
                    "sampled, or renders the new messages differently after a stand-in turn"
                )
            note = note or why
        return Prompt(ids=self.renderer.render(conv).ids, mode="fresh", note=note if turns else None)

    def tail(self, new_messages: list[Message], closing_text: str | None) -> str | None:
        """What the template writes after an assistant turn's content, given the messages that follow,
        less the stop token the model sampled to close its turn (`closing_text`), which the output holds."""
        stand_in = [Message(role="user", content="?"), Message(role="assistant", content=SENTINEL)]
        if self._stand_in_text is None:
            self._stand_in_text = self.renderer.render_text(
                Conversation(messages=stand_in), add_generation_prompt=False
            )
        before = self._stand_in_text
        after = self.renderer.render_text(Conversation(messages=stand_in + list(new_messages)))
        cut = before.find(SENTINEL)
        if cut < 0 or not after.startswith(before[: cut + len(SENTINEL)]):
            return None
        tail = after[cut + len(SENTINEL) :]
        if closing_text is not None:
            if not tail.startswith(closing_text):
                return None  # the model closed its turn with a token the template does not write there
            tail = tail[len(closing_text) :]
        return tail
