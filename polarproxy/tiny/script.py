"""The script the tiny model is trained to play, as plain data.

The example agent imports this module too, so the agent and the model agree on the tools, the prompts,
the format of tool results and the replies. A scripted episode is three assistant turns:

1. after a user prompt from `USER_PROMPTS`: call `list_files` on ".";
2. after the `list_files` result (a newline-separated listing that contains README.md): call `read_file`
   on "README.md";
3. after the `read_file` result: answer `FINAL_ANSWER` and end the turn.

Side requests (a title for the conversation) are answered with a short title (`TITLE_ANSWER`).
"""

from __future__ import annotations

import json
import random
from typing import Any


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


SYSTEM_PROMPT = (
    "You are a careful coding agent working in a small repository. "
    "Use the tools to look at the workspace, then answer in one short sentence."
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List the files in a directory of the workspace.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Directory to list, relative to the workspace."}
                },
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file of the workspace.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File to read, relative to the workspace."}
                },
                "required": ["path"],
            },
        },
    },
]

USER_PROMPTS: tuple[str, ...] = (
    "List the files, read README.md, then say done.",
    "Please list the files, read README.md and then say done.",
    "Look at the files in this folder, read README.md, then say done.",
    "List the files here, then read README.md, and say done when finished.",
)

LIST_FILES_CALL: dict[str, Any] = {"name": "list_files", "arguments": {"path": "."}}
READ_FILE_CALL: dict[str, Any] = {"name": "read_file", "arguments": {"path": "README.md"}}
FINAL_ANSWER = "Done."

TITLE_SYSTEM_PROMPT = "Generate a short title for the conversation. Reply with the title only."
TITLE_ANSWER = "Reading the README"
TITLE_PROMPTS: tuple[str, ...] = (
    "Generate a title for this conversation.",
    "Write a short title for this chat.",
    "Give this conversation a title in a few words.",
)

END_OF_TURN = "<|im_end|>"


def tool_call_text(call: dict[str, Any]) -> str:
    """The assistant text of one tool call, as the chat template renders it."""
    body = json.dumps({"name": call["name"], "arguments": call["arguments"]}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


# What the model says at each scripted turn (without the end-of-turn token).
EXPECTED_REPLIES: tuple[str, str, str] = (
    tool_call_text(LIST_FILES_CALL),
    tool_call_text(READ_FILE_CALL),
    FINAL_ANSWER,
)

_NAMES = _words(
    """
    main utils config server client models views tests setup parser cache worker app cli helpers
    schema routes storage logging metrics notes todo
    """
)
_EXTS = _words(
    """
    .py .txt .json .toml .md .sh .yaml .cfg .js .rs
    """
)
_DIRS = ("src/", "docs/", "tests/", "scripts/", "data/", "")
_WORDS = _words(
    """
    a small tool that reads files and prints reports for the project this repository holds scripts
    to parse logs build run quick tests simple server with an http api notes about setup usage
    install python package example data demo agent works offline fast clean
    """
)


def random_workspace(rng: random.Random) -> dict[str, str]:
    """A random workspace: file name → text, always with a README.md."""
    files: dict[str, str] = {"README.md": random_readme(rng)}
    for _ in range(rng.randint(1, 7)):
        name = rng.choice(_DIRS) + rng.choice(_NAMES) + rng.choice(_EXTS)
        files.setdefault(name, " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 12))) + "\n")
    return files


def random_readme(rng: random.Random) -> str:
    title = rng.choice(_NAMES).capitalize() + rng.choice(("", " tool", " service", " kit", " demo"))
    words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 24)))
    return f"# {title}\n\n{words[0].upper()}{words[1:]}.\n"


def list_files_result(workspace: dict[str, str]) -> str:
    """The `list_files` tool result: one path per line, sorted."""
    return "\n".join(sorted(workspace))


def read_file_result(workspace: dict[str, str], path: str) -> str:
    """The `read_file` tool result: the file's text, or an error line."""
    if path not in workspace:
        return f"Error: no such file: {path}"
    return workspace[path]


def run_tool(name: str, arguments: dict[str, Any], workspace: dict[str, str]) -> str:
    """Run a scripted tool against an in-memory workspace."""
    if name == "list_files":
        return list_files_result(workspace)
    if name == "read_file":
        return read_file_result(workspace, str(arguments.get("path", "")))
    return f"Error: unknown tool: {name}"


def assistant_tool_call(call: dict[str, Any], call_id: str) -> dict[str, Any]:
    """An OpenAI-style assistant message holding one tool call (arguments as a mapping)."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": call["name"], "arguments": call["arguments"]},
            }
        ],
    }


def scripted_conversation(
    user_prompt: str, workspace: dict[str, str], *, system_prompt: str | None = SYSTEM_PROMPT
) -> list[dict[str, Any]]:
    """The whole scripted episode as chat messages, ending with the final answer."""
    messages: list[dict[str, Any]] = []
    if system_prompt is not None:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": user_prompt})
    messages.append(assistant_tool_call(LIST_FILES_CALL, "call_1"))
    messages.append({"role": "tool", "tool_call_id": "call_1", "content": list_files_result(workspace)})
    messages.append(assistant_tool_call(READ_FILE_CALL, "call_2"))
    messages.append(
        {"role": "tool", "tool_call_id": "call_2", "content": read_file_result(workspace, "README.md")}
    )
    messages.append({"role": "assistant", "content": FINAL_ANSWER})
    return messages
