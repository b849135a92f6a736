from dataclasses import asdict

import pytest

from polarproxy.conversation import Completion, Conversation, Message, Sampling, Tool, ToolCall, Usage
from polarproxy.dialects.openai_chat import OpenAIChat


def sample() -> Conversation:
    return Conversation(
        messages=[
            Message(role="system", content="s"),
            Message(
                role="assistant", content="", reasoning="r", tool_calls=[ToolCall("c1", "f", '{"a": 1}')]
            ),
            Message(role="tool", content="out", tool_call_id="c1", name="f"),
        ],
        tools=[Tool(name="f", description="d", parameters={"type": "object", "properties": {"a": {}}})],
        sampling=Sampling(max_tokens=5, temperature=0.0, stop=["x"], seed=3),
        model="m",
        stream=True,
        include_usage=True,
        tool_choice="auto",
    )


def test_to_dict_is_the_full_dataclass_content_and_round_trips():
    conv = sample()
    assert conv.to_dict() == asdict(conv)
    assert Conversation.from_dict(conv.to_dict()) == conv


@pytest.mark.parametrize("harness", ["qwen", "opencode", "pi", "aider"])
def test_captured_requests_round_trip_through_the_stored_form(traffic, harness):
    for rec in traffic(harness):
        conv = OpenAIChat().parse(rec["body"])
        assert Conversation.from_dict(conv.to_dict()) == conv


def test_completion_as_message():
    c = Completion(text="t", reasoning="r", tool_calls=[ToolCall("i", "n", "{}")], usage=Usage(1, 2))
    assert c.as_message() == Message(role="assistant", content="t", reasoning="r", tool_calls=c.tool_calls)
    assert c.usage.total_tokens == 3
