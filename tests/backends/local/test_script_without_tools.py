"""Scripts for harnesses without tools (Aider): `no_tools: steps` plays the steps on calls that offer no
tools, picked by which replies the prompt already holds; `side_when` still tells side requests apart."""

from __future__ import annotations

import pytest

from polarproxy.backends.local.script import Script, ScriptError
from polarproxy.conversation import Conversation, Message
from polarproxy.render.renderer import Renderer

EDIT_1 = "hello.py\n```python\n<<<<<<< SEARCH\nprint('hello')\n=======\nprint('hi')\n>>>>>>> REPLACE\n```"
EDIT_2 = "hello.py\n```python\n<<<<<<< SEARCH\nprint('hi')\n=======\nprint('bye')\n>>>>>>> REPLACE\n```"
SCRIPT = {
    "steps": [{"reasoning": "Edit it.", "text": EDIT_1}, {"text": EDIT_2}],
    "final": "Done.",
    "side_answer": "Change the greeting",
    "no_tools": "steps",
    "side_when": ["commit message"],
}


def conv(*replies: str, system: str = "You edit code.") -> Conversation:
    """A history rebuilt each turn: each earlier reply, then the harness's feedback as a user message."""
    msgs = [Message(role="system", content=system), Message(role="user", content="Change hello.py")]
    for reply in replies:
        msgs.append(Message(role="assistant", content=reply))
        msgs.append(Message(role="user", content="The test failed: hello.py must print bye"))
    return Conversation(messages=msgs, tools=[])


def test_steps_follow_the_replies_the_prompt_holds(tiny_model_dir):
    r = Renderer(tiny_model_dir)
    script = Script.from_data(SCRIPT)
    assert script.reply_for(r.render(conv()).text) == f"<think>\nEdit it.\n</think>\n\n{EDIT_1}"
    assert script.reply_for(r.render(conv(EDIT_1)).text) == EDIT_2
    assert script.reply_for(r.render(conv(EDIT_1, EDIT_2)).text) == "Done."
    # the commit-message request quotes the same replies, but is a side request
    commit = conv(EDIT_1, system="Write a one-line git commit message.")
    assert script.reply_for(r.render(commit).text) == "Change the greeting"


def test_by_default_calls_without_tools_are_side_requests(tiny_model_dir):
    r = Renderer(tiny_model_dir)
    script = Script.from_data({k: v for k, v in SCRIPT.items() if k not in ("no_tools", "side_when")})
    assert script.no_tools == "side"
    assert script.reply_for(r.render(conv()).text) == "Change the greeting"


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ({"no_tools": "always"}, "'no_tools' is 'always'; allowed: 'side', 'steps'"),
        ({"no_tools": "steps", "side_when": "commit"}, "'side_when' must be a list of non-empty strings"),
        ({"side_when": ["commit"]}, "'side_when' applies only with 'no_tools: steps'"),
    ],
)
def test_bad_fields_are_named(extra, fragment):
    with pytest.raises(ScriptError) as e:
        Script.from_data({"steps": ["x"], **extra}, source="s.yaml")
    assert fragment in str(e.value)
