"""T2 recognises its own assistant turn by the answer's signature when the harness drops the tool call
IDs polarproxy returned (Pi over the Gemini API sends `functionCall` back without its `id`, but keeps the
`thoughtSignature`)."""

from __future__ import annotations

from polarproxy.conversation import Completion, Message, ToolCall
from polarproxy.render.prefix import is_returned_turn

RETURNED = Completion(
    tool_calls=[ToolCall("call_6af2", "bash", '{"command": "ls"}')],
    finish_reason="tool_calls",
    signature="polarproxy:1ecb",
)


def sent(call_id: str, signature: str | None) -> Message:
    return Message(
        role="assistant",
        tool_calls=[ToolCall(call_id, "bash", '{"command": "ls"}')],
        signature=signature,
    )


def test_tool_call_ids_or_the_signature_name_the_returned_turn():
    assert is_returned_turn(sent("call_6af2", None), RETURNED)  # IDs kept
    assert is_returned_turn(sent("call_1_0", "polarproxy:1ecb"), RETURNED)  # IDs dropped, signature kept
    assert not is_returned_turn(sent("call_1_0", None), RETURNED)  # neither: not recognised
    assert not is_returned_turn(sent("call_1_0", "polarproxy:other"), RETURNED)  # another answer's
