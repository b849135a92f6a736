"""T2: prefix-preserving prompts. A call that extends an earlier call of its episode is prompted with
`earlier prompt IDs + earlier output IDs + tail`, so the model always sees its own sampled tokens:
nothing it sampled is re-tokenized, and templates that drop old reasoning (Qwen3) or harnesses that
re-serialize tool arguments cannot make the context drift.

An earlier call is extended when the new request repeats its messages exactly, then carries the
assistant turn it returned (recognised by tool call IDs, the answer's signature, or its exact text and
reasoning), then only new messages, with the same tools. Otherwise the prompt is rendered fresh, and the
reason is recorded.

The tail is what the chat template writes after that assistant turn in *this* conversation: its end of
turn, the tool-response wrapping, the next user turn, the generation prompt. Templates render a turn
differently by what follows it (Qwen3 writes an empty think block only for the last turn, and drops
reasoning before the last user query), so the tail is cut from a rendering in which the turn has the
same followers and the same place relative to the last user query as in the real conversation:

    [the leading system messages] + [a stand-in user query, when the real turn has a user query before
    it] + [the turn, its content or tool-call arguments replaced by a sentinel] + [the new messages]

with the real tools. Everything the seven templates of the tests read to render the new messages is in
it: the system text and tools (Mistral writes them into the last user message), the tool calls' IDs and
names (Hermes names tool results after them), whether the turn made tool calls (DeepSeek), whether a
user query precedes it (Llama 3.1 puts the tools in the first one); so its cost does not grow with the
conversation. A template that reads more of the history would render it differently: the first
continuation of each shape (which roles follow, whether the turn made tool calls, the history's length
in powers of two) is also cut from the whole real conversation, and where the two differ the index
renders the whole conversation from then on and logs it (`check="always"` compares every call; the tests
do). Those checks cost a whole render at 1, 2, 4, 8, ... messages per shape: amortized, a constant per
call.

The tail starts after the end-of-turn token the model sampled (the output holds it). A turn that ended
without it (cut by max_tokens, or by a stop string that was trimmed) is closed with the template's own
closing text: tokens the model did not sample, so they are prompt tokens of the new call (masked), and
the prompt's note says so. A tail that would lose a new message (a template that moves a new system
message to the front) cannot extend: the call is rendered fresh and the note names the behaviour.

Templates whose rendering of earlier turns changes as the conversation grows (Mistral writes the tools
and the system prompt into the *last* user message) cannot be both prefix-preserving and faithful to
the template: policy `extend` (the default) keeps the model's context as it was and renders only the
new messages with the template; policy `fresh` renders every call fresh, exactly as the template does,
and gives up T2 (no call extends another). The prompt records the policy.
"""

from __future__ import annotations

import json
import logging
import re
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from polarproxy.choices import PREFIX_POLICIES, PrefixPolicy
from polarproxy.conversation import Completion, Conversation, Message, ToolCall, Usage
from polarproxy.errors import UsageError
from polarproxy.render.folds import fold_level, fold_name
from polarproxy.render.renderer import Renderer

log = logging.getLogger("polarproxy.prefix")

SENTINEL = "polarproxy-sentinel-6c1f0e"
SENTINEL_ARGUMENTS = json.dumps({"polarproxy": SENTINEL})
STAND_IN_QUERY = "?"
# Memory bound for `serve` with many episodes: token IDs are kept as int32 arrays (~4 bytes a token);
# the conversations are the bulk (a Qwen Code request is ~78 KB of text).
MAX_EPISODES = 256
CALLS_PER_EPISODE = 8
MAX_CHECKED_SHAPES = 256

POLICIES = PREFIX_POLICIES
Check = Literal["once", "always"]


def check_policy(policy: str) -> PrefixPolicy:
    """`policy` if it is a prefix policy, else a usage error naming the allowed ones."""
    if policy not in POLICIES:
        raise UsageError(
            f"Unknown prefix policy {policy!r}. Must be one of {', '.join(map(repr, POLICIES))}.",
            hint="'extend' keeps each call's prompt a prefix of the next (T2); 'fresh' renders every call "
            "with the chat template as it stands (for templates that rewrite earlier turns, e.g. Mistral).",
        )
    return policy  # type: ignore[return-value]


@dataclass(slots=True, frozen=True)
class Turn:
    """A finished call that later calls may extend."""

    call_id: str
    conversation: Conversation
    completion: Completion
    prompt_ids: array[int]  # int32
    output_ids: array[int]
    closing_text: str | None  # the stop token that ended the output; None if cut by length or a stop string
    fold: str | None = None  # the fold its prompt was rendered with (Prompt.fold)


@dataclass(slots=True)
class Prompt:
    """A call's prompt. `tokens` is one int32 array: an extension is the earlier call's prompt and output
    arrays joined with the tail's IDs at memory-copy speed, and the same array goes to the backend's JSON,
    the store's packed column and the T2 index, with no Python int per token on the way."""

    tokens: array[int]  # int32
    mode: str  # 'fresh' | 'extended'
    extended_from: str | None = None
    note: str | None = None  # why a call was rendered fresh where an earlier call existed, or what was added
    policy: PrefixPolicy = "extend"
    fold: str | None = None  # the fold the template needed (`polarproxy.render.folds`), None: as sent
    # The template's closing text for an earlier answer that ended without its end-of-turn token: prompt
    # tokens of this call (masked), which the model did not sample.
    closing_added: str | None = None

    @property
    def ids(self) -> list[int]:
        """The prompt as a list (a copy: for tests and tools; the proxy reads `tokens`)."""
        return self.tokens.tolist()

    def record_note(self) -> str | None:
        """The note as the call's record keeps it: why it was rendered fresh or what was added, then the
        fold and the policy where they are not the defaults."""
        parts = [self.note] if self.note else []
        if self.fold:
            parts.append(f"fold: {self.fold} (the chat template refused the conversation as sent)")
        if self.policy != "extend" and not self.note:
            parts.append(f"prefix policy: {self.policy}")
        return "; ".join(parts) or None


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
        if a is not b and a != b:  # reused Messages (dialects/resend.py) are the same objects
            return f"message {i} differs from call {turn.call_id}'s (edited history, compaction or a changed system prompt)"
    if not is_returned_turn(conv.messages[n], turn.completion):
        return f"message {n} is not the assistant turn call {turn.call_id} returned"
    if any(m.role == "assistant" for m in conv.messages[n + 1 :]):
        return "the new messages hold an assistant turn polarproxy did not sample"
    return None


def _shape(conv: Conversation, turn: Turn) -> tuple[bool, tuple[str, ...], int]:
    """The shape of `conv`'s continuation of `turn` that a whole-conversation check covers: whether the
    answer made tool calls, the roles of the new messages, and the history's length in powers of two.
    Checked once per shape: amortized, a constant number of whole-conversation renders per call, and a
    history-reading template is found by the time the history is twice as long as when it first rendered
    the same."""
    n = len(turn.conversation.messages)
    return (bool(conv.messages[n].tool_calls), tuple(m.role for m in conv.messages[n + 1 :]), n.bit_length())


@dataclass(slots=True, frozen=True)
class Tail:
    text: str
    fold: int
    closing_added: str | None = None


def stand_in_turn(sent: Message) -> Message:
    """The assistant turn with a sentinel where the model's tokens go: its content, or the arguments
    of its tool calls (templates such as Mistral's and Hermes's do not write the content of a turn that
    makes tool calls). IDs and names are kept: the tool results refer to them."""
    if not sent.tool_calls:
        return Message(role="assistant", content=SENTINEL)
    calls = [ToolCall(t.id, t.name, SENTINEL_ARGUMENTS) for t in sent.tool_calls]
    return Message(role="assistant", tool_calls=calls)


def _contains(text: str, content: str) -> bool:
    """Whether the template wrote `content` into `text` (as is, trimmed, or JSON-escaped)."""
    c = content.strip()
    return not c or c in text or json.dumps(c, ensure_ascii=False)[1:-1] in text


TurnLoader = Callable[[str], list[Turn]]  # an episode's recent finished calls, from the store


class PrefixIndex:
    """Recent finished calls per episode, in memory: a cache. On a miss for an episode (a proxy that did
    not serve its earlier calls: a restart, another node), `loader` (when set) loads its recent finished
    calls from the store once, so its next call still extends them."""

    def __init__(
        self,
        renderer: Renderer,
        *,
        policy: str = "extend",
        check: Check = "once",
        loader: TurnLoader | None = None,
    ) -> None:
        self.renderer = renderer
        self.loader = loader
        self.policy: PrefixPolicy = check_policy(policy)
        self.check = check
        self._episodes: OrderedDict[str, list[Turn]] = OrderedDict()
        self._checked: set[tuple[bool, tuple[str, ...], int]] = set()
        self.needs_history = False  # the template reads more history than the stand-in holds
        self._stop_texts: list[str] | None = None

    def remember(self, episode_id: str, turn: Turn) -> None:
        turns = self._episodes.setdefault(episode_id, [])
        self._episodes.move_to_end(episode_id)
        turns.append(turn)
        del turns[:-CALLS_PER_EPISODE]
        while len(self._episodes) > MAX_EPISODES:
            self._episodes.popitem(last=False)

    def turns(self, episode_id: str) -> list[Turn]:
        """The episode's recent finished calls: from memory, else (once) from `loader`."""
        turns = self._episodes.get(episode_id)
        if turns is not None or self.loader is None:
            return turns or []
        try:
            loaded = self.loader(episode_id)[-CALLS_PER_EPISODE:]
        except Exception as e:  # the store cannot be read: render fresh, and try again next call
            log.warning("could not load the earlier calls of episode %s from the store: %s", episode_id, e)
            return []
        turns = self._episodes.setdefault(episode_id, [])
        known = {t.call_id for t in turns}  # remembered while loading
        turns[:0] = [t for t in loaded if t.call_id not in known]
        del turns[:-CALLS_PER_EPISODE]
        while len(self._episodes) > MAX_EPISODES:
            self._episodes.popitem(last=False)
        return turns

    def build(self, episode_id: str, conv: Conversation) -> Prompt:
        """The prompt for `conv`: extending the most recent call it extends, else rendered fresh."""
        prompt = self._build(episode_id, conv, budget=None)
        assert prompt is not None  # no budget: always built
        return prompt

    def build_within(self, episode_id: str, conv: Conversation, budget: int) -> Prompt | None:
        """The prompt for `conv` if making it renders at most about `budget` characters of messages: an
        extension whose new messages are that short, with no whole-conversation check due. Else None, and
        the caller builds it with `build` (the gateway, in a worker thread). An extension's cost does not
        grow with the conversation, so a long request need not leave the event loop for it."""
        return self._build(episode_id, conv, budget=budget)

    def _build(self, episode_id: str, conv: Conversation, budget: int | None) -> Prompt | None:
        if budget is not None and (
            self.policy == "fresh" or (episode_id not in self._episodes and self.loader is not None)
        ):
            return None  # a fresh render, or the store's read of the episode's calls
        turns = self.turns(episode_id) if self.policy == "extend" else self._episodes.get(episode_id, [])
        if self.policy == "fresh":
            rendered = self.renderer.render(conv)
            note = (
                "prefix policy 'fresh': every call is rendered with the chat template as it stands"
                if turns
                else None
            )
            return Prompt(
                tokens=array("i", rendered.ids), mode="fresh", note=note, policy="fresh", fold=rendered.fold
            )
        note = None
        for turn in sorted(turns, key=lambda t: len(t.conversation.messages), reverse=True):
            why = _mismatch(conv, turn)
            if why is None:
                if budget is not None and not self._cheap_tail(conv, turn, budget):
                    return None
                tail = self.tail(conv, turn)
                if isinstance(tail, Tail):
                    ids = turn.prompt_ids + turn.output_ids + array("i", self.renderer.encode(tail.text))
                    added = None
                    if tail.closing_added is not None:
                        added = (
                            f"call {turn.call_id}'s answer ended without its end-of-turn token (cut by "
                            f"max_tokens or a stop string); the template's closing text {tail.closing_added!r} "
                            "was added as prompt tokens (masked: the model did not sample them)"
                        )
                    return Prompt(
                        tokens=ids,
                        mode="extended",
                        extended_from=turn.call_id,
                        note=added,
                        fold=fold_name(tail.fold),
                        closing_added=tail.closing_added,
                    )
                why = tail
            note = note or why
        if budget is not None:
            return None  # a fresh render: its cost grows with the conversation
        rendered = self.renderer.render(conv)
        return Prompt(
            tokens=array("i", rendered.ids), mode="fresh", note=note if turns else None, fold=rendered.fold
        )

    # -- the tail -------------------------------------------------------------------------------

    def tail(self, conv: Conversation, turn: Turn) -> Tail | str:
        """What the template writes after `turn`'s answer in `conv` (which extends it), less the stop
        token the model sampled to close its turn; or why it cannot be appended."""
        n = len(turn.conversation.messages)
        sent, followers = conv.messages[n], conv.messages[n + 1 :]
        stand_in = stand_in_turn(sent)
        shape = _shape(conv, turn)
        whole = self.needs_history or self.check == "always" or shape not in self._checked
        lead = 0
        while lead < n and conv.messages[lead].role == "system":
            lead += 1
        short = list(conv.messages[:lead])
        if any(m.role == "user" for m in conv.messages[lead:n]):
            short.append(Message(role="user", content=STAND_IN_QUERY))
        min_fold = fold_level(turn.fold)
        tail: Tail | str
        if self.needs_history:
            tail = self._cut(conv, [*conv.messages[:n], stand_in, *followers], sent, turn, min_fold)
        else:
            tail = self._cut(conv, [*short, stand_in, *followers], sent, turn, min_fold)
            if whole:
                real = self._cut(conv, [*conv.messages[:n], stand_in, *followers], sent, turn, min_fold)
                if len(self._checked) < MAX_CHECKED_SHAPES:
                    self._checked.add(shape)
                if isinstance(real, str):
                    return real  # the template refuses the whole conversation
                if isinstance(tail, str) or (real.text, real.closing_added) != (
                    tail.text,
                    tail.closing_added,
                ):
                    log.warning(
                        "the chat template renders the messages after an answer differently with more of the "
                        "history before it; tails are cut from whole conversations from now on"
                    )
                    self.needs_history = True
                    tail = real
                elif real.fold > tail.fold:
                    tail = real  # the same text; the fold the whole conversation needed is the one to record
        if isinstance(tail, str):
            return tail
        for i, m in enumerate(followers, start=n + 1):
            if not _contains(tail.text, m.content):
                return (
                    f"the chat template does not write message {i} ({m.role}) after the answer of call "
                    f"{turn.call_id}, but earlier in the prompt (it moves or merges such messages), so the "
                    "new prompt cannot extend that call's tokens"
                )
        return tail

    def _cheap_tail(self, conv: Conversation, turn: Turn, budget: int) -> bool:
        """Whether `tail` renders only the new messages (no whole conversation) and they are within `budget`
        characters."""
        if self.needs_history or self.check == "always" or _shape(conv, turn) not in self._checked:
            return False
        chars = 0
        for m in conv.messages[len(turn.conversation.messages) + 1 :]:
            chars += len(m.content) + len(m.reasoning or "") + sum(len(t.arguments) for t in m.tool_calls)
        return chars <= budget

    def stop_texts(self) -> list[str]:
        if self._stop_texts is None:
            self._stop_texts = [self.renderer.token_text(i) for i in self.renderer.stop_token_ids]
        return self._stop_texts

    def _cut(
        self, conv: Conversation, messages: list[Message], sent: Message, turn: Turn, min_fold: int
    ) -> Tail | str:
        """The tail cut from the template's text for `messages` (the turn replaced by its stand-in)."""
        try:
            text, level = self.renderer.render_folded(
                Conversation(messages=messages, tools=conv.tools), min_fold=min_fold
            )
        except Exception as e:  # the template refuses the new messages after this turn
            return f"the chat template refuses the new messages after call {turn.call_id}'s answer: {e}"
        pos = text.rfind(SENTINEL)
        if pos < 0:
            what = "tool-call arguments" if sent.tool_calls else "content"
            return f"the chat template does not write an assistant turn's {what} where the model's tokens go"
        after = text[pos + len(SENTINEL) :]
        closing = turn.closing_text
        if closing is not None:
            # content: the end-of-turn token must follow at once; tool calls: the template's own syntax
            # of the calls (which the model sampled in its format) comes first
            at = after.find(closing) if sent.tool_calls else (0 if after.startswith(closing) else -1)
            if at < 0:
                return (
                    f"the model ended call {turn.call_id}'s answer with {closing!r}, but the chat template "
                    f"writes {after[:40]!r} after such an answer: appending would give the model a context "
                    "it did not produce (set the model's stop tokens to the template's end-of-turn token)"
                )
            return Tail(after[at + len(closing) :], level)
        ends = [(i, s) for s in self.stop_texts() if (i := after.find(s)) >= 0]
        if not ends:
            return (
                f"call {turn.call_id}'s answer ended without an end-of-turn token, and the chat template "
                "writes none of the model's stop tokens after such an answer, so it cannot be closed"
            )
        at, stop = min(ends)
        start = at if sent.tool_calls else 0  # after tool calls, only the end-of-turn token is the template's
        return Tail(after[start:], level, closing_added=after[start : at + len(stop)])


_FOLD_NOTE = re.compile(r"fold: ([a-z+-]+) \(")


def completion_from_dict(data: dict[str, Any]) -> Completion:
    """The inverse of `Completion.to_dict` (a call's stored `completion`)."""
    return Completion(
        text=data.get("text", ""),
        reasoning=data.get("reasoning"),
        tool_calls=[ToolCall(**t) for t in data.get("tool_calls", [])],
        finish_reason=data.get("finish_reason", "stop"),
        usage=Usage(**data.get("usage", {})),
        signature=data.get("signature"),
    )


def turn_from_record(
    renderer: Renderer,
    *,
    call_id: str,
    conversation: dict[str, Any] | None,
    completion: dict[str, Any] | None,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    finish_reason: str | None,
    render_note: str | None,
) -> Turn | None:
    """The Turn a stored finished call stands for, as the gateway remembered it when it served the call
    (`_finish_ok`): the closing text is the stop token that ended the output, the fold the one its note
    names. None for a call that cannot be extended (no conversation or completion recorded)."""
    if conversation is None or completion is None:
        return None
    closing = None
    if finish_reason == "stop" and output_ids and output_ids[-1] in renderer.stop_token_ids:
        closing = renderer.token_text(output_ids[-1])
    fold = _FOLD_NOTE.search(render_note or "")
    return Turn(
        call_id=call_id,
        conversation=Conversation.from_dict(conversation),
        completion=completion_from_dict(completion),
        prompt_ids=array("i", prompt_ids),
        output_ids=array("i", output_ids),
        closing_text=closing,
        fold=fold.group(1) if fold else None,
    )
