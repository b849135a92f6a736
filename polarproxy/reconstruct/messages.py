"""Neutral conversations (Conversation.to_dict / Completion.to_dict) as OpenAI-style chat messages and tools."""

from __future__ import annotations

from typing import Any


def _tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
        for c in calls
    ]


def chat_message(message: dict[str, Any]) -> dict[str, Any]:
    """One neutral message as {role, content[, reasoning_content][, tool_calls][, tool_call_id][, name]}."""
    out: dict[str, Any] = {"role": message["role"], "content": message.get("content") or ""}
    if message.get("reasoning") is not None:
        out["reasoning_content"] = message["reasoning"]
    if message.get("tool_calls"):
        out["tool_calls"] = _tool_calls(message["tool_calls"])
    if message.get("tool_call_id") is not None:
        out["tool_call_id"] = message["tool_call_id"]
    if message.get("name") is not None:
        out["name"] = message["name"]
    return out


def assistant_message(completion: dict[str, Any]) -> dict[str, Any]:
    """The model's reply (a neutral Completion) as an assistant chat message."""
    return chat_message(
        {
            "role": "assistant",
            "content": completion.get("text") or "",
            "reasoning": completion.get("reasoning"),
            "tool_calls": completion.get("tool_calls") or [],
        }
    )


def chat_messages(
    conversation: dict[str, Any] | None, completion: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """The request's messages followed by the reply (when there is one)."""
    messages = [chat_message(m) for m in (conversation or {}).get("messages", [])]
    if completion is not None:
        messages.append(assistant_message(completion))
    return messages


def chat_tools(conversation: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The request's tools as OpenAI function tools."""
    return [
        {
            "type": "function",
            "function": {
                "name": t["name"],
                "description": t.get("description") or "",
                "parameters": t.get("parameters") or {},
            },
        }
        for t in (conversation or {}).get("tools", [])
    ]
