"""Hand-made stores for the audit: real SQLite, the tiny model's real tokenizer and chat template, and
prompts built by the real T2 code (`PrefixIndex`)."""

from __future__ import annotations

from array import array
from typing import Any

from polarproxy.conversation import Completion, Conversation, Message, Tool, ToolCall
from polarproxy.render.prefix import PrefixIndex, Turn
from polarproxy.render.renderer import Renderer
from polarproxy.store import CallResult, CallStart, EpisodeStart, Store

TOOLS = [Tool(name="ls", description="List files.", parameters={"type": "object"})]


def add_call(
    store: Store,
    episode_id: str,
    conversation: Conversation | dict[str, Any] | None,
    prompt_ids: list[int],
    output_ids: list[int] | None = None,
    completion: Completion | None = None,
    **start: Any,
) -> str:
    conv = conversation.to_dict() if isinstance(conversation, Conversation) else conversation
    call_id, _ = store.begin_call(
        CallStart(
            episode_id=episode_id,
            dialect="openai_chat",
            method="POST",
            path="/v1/chat/completions",
            model="tiny",
            stream=False,
            request_headers={},
            request_body="{}",
            conversation=conv,
            prompt_ids=prompt_ids,
            **start,
        )
    )
    out = output_ids or []
    store.finish_call(
        call_id,
        CallResult(
            status="ok",
            completion=completion.to_dict() if completion else None,
            output_ids=out,
            output_logprobs=[-0.5] * len(out),
            finish_reason="stop",
        ),
    )
    return call_id


class Episode2:
    """Two calls the way the gateway records them: a fresh first call whose output holds `sampled`, then
    a request that carries the harness's version of that answer plus `then`, prompted by T2."""

    def __init__(
        self,
        store: Store,
        r: Renderer,
        *,
        sampled: str,
        completion: Completion,
        returned: Message,
        then: list[Message],
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.first = Conversation(
            messages=[Message(role="system", content="Be brief."), Message(role="user", content="List.")],
            tools=TOOLS,
        )
        self.prompt1 = r.render(self.first).ids
        end = r.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.output1 = [*r.encode(sampled), end]
        self.second = Conversation(messages=[*self.first.messages, returned, *then], tools=TOOLS)
        self.episode_id = store.create_episode(EpisodeStart(command=["test"], metadata=metadata or {}))
        self.call1 = add_call(store, self.episode_id, self.first, self.prompt1, self.output1, completion)
        index = PrefixIndex(r)
        index.remember(
            self.episode_id,
            Turn(
                self.call1,
                self.first,
                completion,
                array("i", self.prompt1),
                array("i", self.output1),
                "<|im_end|>",
            ),
        )
        built = index.build(self.episode_id, self.second)
        assert built.mode == "extended", built.note
        self.prompt2 = built.ids
        self.call2 = add_call(
            store,
            self.episode_id,
            self.second,
            self.prompt2,
            [*r.encode("Done."), end],
            render_mode="extended",
            extended_from=self.call1,
        )


def reasoning_episode(store: Store, r: Renderer, **kw: Any) -> Episode2:
    """The model thought, then called a tool; after the result the user speaks again, so a Qwen3-style
    template drops that reasoning from a fresh render."""
    call = ToolCall("call_1", "ls", '{"path": "."}')
    return Episode2(
        store,
        r,
        sampled='<think>\nI should list.\n</think>\n\n<tool_call>\n{"name": "ls", "arguments": {"path": "."}}\n'
        "</tool_call>",
        completion=Completion(reasoning="I should list.", tool_calls=[call], finish_reason="tool_calls"),
        returned=Message(role="assistant", reasoning="I should list.", tool_calls=[call]),
        then=[
            Message(role="tool", content="a.txt", tool_call_id="call_1"),
            Message(role="user", content="And now?"),
        ],
        **kw,
    )
