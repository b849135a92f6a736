"""The requests the test clients send through `record --intercept`: one per provider format, streamed and not."""

from __future__ import annotations

from typing import Any

SECRET = "sk-test-secret-never-stored"

CHAT = {
    "model": "gpt-4o",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "List the files."},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "ls",
                "description": "List files",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
    ],
}
RESPONSES = {
    "model": "gpt-5",
    "instructions": "Be brief.",
    "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]}],
    "store": False,
}
ANTHROPIC = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 1024,
    "system": "You are a coding agent.",
    "messages": [{"role": "user", "content": "List the files."}],
    "tools": [{"name": "Bash", "description": "Run", "input_schema": {"type": "object"}}],
}
GEMINI = {
    "contents": [{"role": "user", "parts": [{"text": "Read the README."}]}],
    "tools": [{"functionDeclarations": [{"name": "read_file", "parameters": {"type": "object"}}]}],
}

OPENAI_AUTH = {"authorization": f"Bearer {SECRET}"}
ANTHROPIC_AUTH = {"x-api-key": SECRET, "anthropic-version": "2023-06-01"}
GEMINI_AUTH = {"x-goog-api-key": SECRET}


def plan() -> list[dict[str, Any]]:
    """name, method, url, headers, json body; `recorded` says whether polarproxy must record it."""
    g = "https://generativelanguage.googleapis.com/v1beta/models"
    items = [
        ("chat", "https://api.openai.com/v1/chat/completions", OPENAI_AUTH, CHAT),
        (
            "chat-stream",
            "https://api.openai.com/v1/chat/completions",
            OPENAI_AUTH,
            {**CHAT, "stream": True, "stream_options": {"include_usage": True}},
        ),
        ("responses", "https://api.openai.com/v1/responses", OPENAI_AUTH, RESPONSES),
        (
            "responses-stream",
            "https://api.openai.com/v1/responses",
            OPENAI_AUTH,
            {**RESPONSES, "stream": True},
        ),
        ("anthropic", "https://api.anthropic.com/v1/messages", ANTHROPIC_AUTH, ANTHROPIC),
        (
            "anthropic-stream",
            "https://api.anthropic.com/v1/messages",
            ANTHROPIC_AUTH,
            {**ANTHROPIC, "stream": True},
        ),
        ("gemini", f"{g}/gemini-2.5-pro:generateContent", GEMINI_AUTH, GEMINI),
        ("gemini-stream", f"{g}/gemini-2.5-flash:streamGenerateContent?alt=sse&key={SECRET}", {}, GEMINI),
    ]
    out = [
        {"name": n, "method": "POST", "url": u, "headers": h, "json": b, "recorded": True}
        for n, u, h, b in items
    ]
    out.append(
        {
            "name": "models",
            "method": "GET",
            "url": "https://api.openai.com/v1/models",
            "headers": OPENAI_AUTH,
            "recorded": False,
        }
    )
    out.append(  # an OpenAI-compatible host that is not a known provider: recorded only with --host
        {
            "name": "custom",
            "method": "POST",
            "url": "https://llm.internal.test/v1/chat/completions",
            "headers": OPENAI_AUTH,
            "json": CHAT,
            "recorded": False,
        }
    )
    out.append(
        {
            "name": "other",
            "method": "GET",
            "url": "https://downloads.example.test/file.txt",
            "headers": {},
            "recorded": False,
        }
    )
    return out
