"""Scripted policies: answers from a script, logprobs from the model, steps read from the prompt."""

from __future__ import annotations

import json

import httpx
import pytest

from polarproxy.backends.local.model_runner import ModelRunner
from polarproxy.backends.local.script import Script, ScriptError, step_index
from polarproxy.backends.local.server import LocalServer
from polarproxy.conversation import Conversation, Message, Tool, ToolCall
from polarproxy.render.renderer import Renderer

SCRIPT = {
    "steps": [
        {"reasoning": "Look first.", "tool_calls": [{"name": "run", "arguments": {"command": "ls"}}]},
        {"text": "Reading it.", "tool_calls": [{"name": "read", "arguments": {"path": "a.txt"}}]},
        {"raw": "All done."},
    ],
    "side_answer": "A title",
    "final": "Nothing more.",
}
TOOLS = [Tool(name="run", parameters={"type": "object"}), Tool(name="read", parameters={"type": "object"})]


def conv(n_steps: int, tools: bool = True) -> Conversation:
    msgs = [Message(role="system", content="sys"), Message(role="user", content="go")]
    for i in range(n_steps):
        msgs.append(Message(role="assistant", tool_calls=[ToolCall(id=f"c{i}", name="run", arguments="{}")]))
        msgs.append(Message(role="tool", content=f"out {i}", tool_call_id=f"c{i}"))
    return Conversation(messages=msgs, tools=TOOLS if tools else [])


def test_steps_follow_the_assistant_turns_since_the_last_user_message(tiny_model_dir):
    r = Renderer(tiny_model_dir)
    script = Script.from_data(SCRIPT)
    replies = [script.reply_for(r.render(conv(i)).text) for i in range(5)]
    assert replies[0].startswith("<think>\nLook first.\n</think>\n\n<tool_call>\n")
    assert (
        replies[1]
        == 'Reading it.\n<tool_call>\n{"name": "read", "arguments": {"path": "a.txt"}}\n</tool_call>'
    )
    assert replies[2:] == ["All done.", "Nothing more.", "Nothing more."]
    # a new user message starts over; a call without tools is a side request
    again = conv(2)
    again.messages.append(Message(role="user", content="next task"))
    assert step_index(r.render(again).text) == 0
    assert script.reply_for(r.render(conv(1, tools=False)).text) == "A title"


def test_cases_choose_other_steps_by_a_text_of_the_prompt_and_a_tool_name(tiny_model_dir):
    r = Renderer(tiny_model_dir)
    script = Script.from_data(
        {
            **SCRIPT,
            "cases": [
                {
                    "when": {"prompt": "task two", "tool": "read"},
                    "steps": ["Two with read."],
                    "final": "End 2.",
                },
                {"when": {"tool": "edit"}, "steps": ["Edit harness."]},
            ],
        }
    )

    def reply(user: str, tools: list[Tool], steps_done: int = 0) -> str:
        c = conv(steps_done)
        c.messages[1] = Message(role="user", content=user)
        return script.reply_for(r.render(Conversation(messages=c.messages, tools=tools)).text)

    edit = [Tool(name="edit", parameters={"type": "object"})]
    assert reply("task two", TOOLS) == "Two with read."
    assert reply("task two", TOOLS, 1) == "End 2."  # the case's own final
    assert reply("task one", TOOLS).startswith("<think>\nLook first.")  # no case: the script's steps
    assert reply("task two", edit) == reply("task one", edit) == "Edit harness."
    assert reply("task one", edit, 1) == "Nothing more."  # the script's final
    # a harness that opens with a context exchange (Qwen Code, Gemini CLI: user context, assistant "Got
    # it.") before the task: the task still chooses the case
    opened = [
        Message(role="system", content="sys"),
        Message(role="user", content="Here is the context."),
        Message(role="assistant", content="Got it."),
        Message(role="user", content="task two"),
    ]
    assert script.reply_for(r.render(Conversation(messages=opened, tools=TOOLS)).text) == "Two with read."
    # a tool output naming another case's text does not switch cases mid-episode
    c = conv(1)
    c.messages[1] = Message(role="user", content="task one")
    c.messages[3] = Message(role="tool", content="task two", tool_call_id="c0")
    assert script.reply_for(
        r.render(Conversation(messages=c.messages, tools=TOOLS)).text
    ) == "Reading it.\n" + ('<tool_call>\n{"name": "read", "arguments": {"path": "a.txt"}}\n</tool_call>')


def test_scripted_answers_carry_the_models_own_logprobs(tiny_model_dir):
    r = Renderer(tiny_model_dir)
    runner = ModelRunner(tiny_model_dir)
    prompt = r.render(conv(1)).ids
    with LocalServer(runner, script=Script.from_data(SCRIPT)) as srv:
        body = {
            "input_ids": prompt,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": 200, "skip_special_tokens": False},
        }
        out = httpx.post(srv.url + "/generate", json=body, timeout=60).json()
        stream = httpx.post(srv.url + "/generate", json={**body, "stream": True}, timeout=60).text
        short = httpx.post(
            srv.url + "/generate", json={**body, "sampling_params": {"max_new_tokens": 3}}, timeout=60
        ).json()
    ids = out["output_ids"]
    assert r.decode(ids[:-1]) == Script.from_data(SCRIPT).steps[1].text
    assert ids[-1] == r.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[-1]}
    lps = [t[0] for t in out["meta_info"]["output_token_logprobs"]]
    assert lps == pytest.approx(runner.score(prompt, ids), abs=1e-5)
    events = [json.loads(line[6:]) for line in stream.splitlines() if line.startswith("data: {")]
    assert events[-1]["output_ids"] == ids and len(events) == len(ids)
    assert short["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    assert short["output_ids"] == ids[:3]


@pytest.mark.parametrize(
    "data, fragment",
    [
        ([], "must be a mapping"),
        ({"steps": []}, "'steps' must be a non-empty list"),
        ({"steps": ["x"], "extra": 1}, "unknown field(s) 'extra'"),
        ({"steps": [{"tool_calls": [{"arguments": {}}]}]}, "steps[0].tool_calls[0] needs a string 'name'"),
        ({"steps": [{"raw": "x", "text": "y"}]}, "'raw' must be a string and stand alone"),
        ({"steps": [{}]}, "steps[0] is empty"),
        ({"steps": ["x"], "cases": {}}, "'cases' must be a list"),
        ({"steps": ["x"], "cases": [{"when": {"tools": "Bash"}, "steps": ["y"]}]}, "cases[0].when must give"),
        ({"steps": ["x"], "cases": [{"when": {"tool": ""}, "steps": ["y"]}]}, "must be non-empty strings"),
        ({"steps": ["x"], "cases": [{"when": {"tool": "Bash"}, "steps": []}]}, "cases[0].steps must be"),
        ({"steps": ["x"], "cases": [{"when": {"tool": "B"}, "steps": [{}]}]}, "cases[0].steps[0] is empty"),
    ],
)
def test_bad_scripts_name_the_field(data, fragment):
    with pytest.raises(ScriptError) as e:
        Script.from_data(data, source="s.yaml")
    assert fragment in str(e.value)


def test_script_files_load_as_yaml_or_json(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps(SCRIPT))
    (tmp_path / "s.yaml").write_text("steps:\n  - text: hi\nside_answer: T\n")
    assert len(Script.load(tmp_path / "s.json").steps) == 3
    assert Script.load(tmp_path / "s.yaml").side_answer == "T"
    (tmp_path / "bad.yaml").write_text("steps: [unclosed")
    with pytest.raises(ScriptError, match="not valid YAML"):
        Script.load(tmp_path / "bad.yaml")
