"""The real Aider (PyPI aider-chat, in its own venv), unmodified, recorded through `--harness aider`.

Aider has no tools: it edits files through SEARCH/REPLACE blocks in its reply text. The closest honest
equivalent of a tool loop is its test loop: with `--auto-test` it applies the reply's edit, runs the test
command, and sends a failing command's output back to the model as a new user message. Here the script's
first edit does not yet make the test pass, the second does: two edits applied over two turns, each
turn's reply recorded with its token IDs and logprobs. Aider rebuilds its whole history every turn
(system prompt, example exchange, the current file contents, then the chat), so the second prompt does
not extend the first: it is rendered fresh, and the record says why (`render_note`). The commit message
for each edit is a side request of the same episode, offering no tools.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from recording import AIDER, check_calls, needs_cli

pytestmark = [pytest.mark.integration, needs_cli("aider", "Aider (PyPI aider-chat)", AIDER)]

EDIT_1 = "hello.py\n```python\n<<<<<<< SEARCH\nprint('hello')\n=======\nprint('hi')\n>>>>>>> REPLACE\n```"
EDIT_2 = "hello.py\n```python\n<<<<<<< SEARCH\nprint('hi')\n=======\nprint('bye')\n>>>>>>> REPLACE\n```"
TEST_FAILS = "hello.py must print bye"
COMMIT = "Change the greeting"
SCRIPT = {
    "steps": [{"text": f"First step.\n\n{EDIT_1}"}, {"text": f"Now it prints bye.\n\n{EDIT_2}\n\nDone."}],
    "final": "Done.",
    "side_answer": COMMIT,
    "no_tools": "steps",  # Aider's calls offer no tools: its edits are text
    "side_when": ["commit message"],  # ...but its commit-message requests are side requests
}


def test_aider_applies_two_edits_over_two_turns(record_harness, make_backend, tiny_model_dir, tmp_path):
    script = tmp_path / "aider-script.json"
    script.write_text(json.dumps(SCRIPT))
    url = make_backend(tiny_model_dir, "--script", str(script)).url
    argv = [
        str(AIDER),
        "--edit-format",
        "diff",
        "--yes-always",
        "--no-show-model-warnings",
        "--auto-test",
        "--test-cmd",
        f"grep -q bye hello.py || {{ echo '{TEST_FAILS}'; exit 1; }}",
        "--message",
        "Change hello.py so that it prints bye.",
        "hello.py",
    ]
    git_id = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid"}
    git_id |= {"GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    rec = record_harness("aider", argv, "--model-name", "tiny", env=git_id, backend_url=url)
    ws = tmp_path / "ws"
    assert (ws / "hello.py").read_text() == "print('bye')\n", rec.tails()  # both edits applied, in order

    check_calls(rec, tiny_model_dir, dialect="openai_chat", auth_header="authorization")
    assert all(not c.has_tools for c in rec.calls)  # Aider never offers tools
    is_side = [COMMIT in (c.completion["text"] or "") for c in rec.calls]
    main = [c for c, side in zip(rec.calls, is_side, strict=True) if not side]
    side = [c for c, side in zip(rec.calls, is_side, strict=True) if side]
    assert len(main) == 2, ([c.completion for c in rec.calls], rec.tails())
    assert main[0].completion["text"].endswith(EDIT_1) and EDIT_2 in main[1].completion["text"]
    assert all(c.stream and len(c.output_logprobs) == len(c.output_ids) > 0 for c in main)
    # turn 2: Aider sent the failing test's output back as a user message, after our first reply
    msgs = main[1].conversation["messages"]
    assert any(m["role"] == "assistant" and EDIT_1 in (m["content"] or "") for m in msgs)
    assert msgs[-1]["role"] == "user" and TEST_FAILS in msgs[-1]["content"]
    # Aider rebuilds its history (the file's new contents come before the chat), so turn 2 is fresh
    assert main[1].render_mode == "fresh" and main[1].extended_from is None
    assert main[1].render_note, "a fresh render of a later turn must say why it did not extend"
    print(f"aider turn 2 rendered fresh: {main[1].render_note}")

    # each edit was committed with a message from a side request of this episode (no tools)
    assert len(side) >= 1 and all(not c.stream or c.status == "ok" for c in side)
    assert all("commit message" in json.dumps(c.conversation["messages"][0]) for c in side)
    log = subprocess.run(["git", "log", "--format=%s"], cwd=ws, capture_output=True, text=True, check=True)
    assert COMMIT in log.stdout, log.stdout
