"""The real Qwen Code CLI runs a real tool loop against a scripted backend: it asks to run `ls`, then
`cat README.md`; Qwen Code runs both, sends each result back, and the script answers. Every token in the
record is still exact: the recorded output is the script's tokens, with the model's own logprobs."""

from __future__ import annotations

import pytest
from recording import (
    BIN,
    FINAL,
    check_calls,
    check_side_requests,
    check_tool_loops,
    needs_cli,
    reasoning_for,
    scripted_backend,
)

from polarproxy.render.renderer import Renderer

pytestmark = [pytest.mark.integration, needs_cli("qwen", "Qwen Code CLI")]
LS = {"command": "ls"}
CAT = {"command": "cat README.md"}


def test_qwen_code_tool_loop_on_a_scripted_backend(record_harness, make_backend, tiny_model_dir, tmp_path):
    url = scripted_backend(
        make_backend, tiny_model_dir, tmp_path, "run_shell_command", LS, ("run_shell_command", CAT)
    )
    rec = record_harness(
        "qwen",
        [str(BIN / "qwen"), "-p", "List the files, read README.md, then say done.", "--yolo"],
        "--model-name",
        "tiny",
        backend_url=url,
    )
    check_calls(rec, tiny_model_dir, dialect="openai_chat", auth_header="authorization")
    # T2: each turn extends the one before although Qwen Code re-serializes the tool arguments
    main = check_tool_loops(rec, ["run_shell_command"] * 2, ["hello.py", "# hello"])
    check_side_requests(rec)
    renderer = Renderer(tiny_model_dir)
    expected = [
        f"<think>\n{reasoning_for(i)}\n</think>\n\n"
        f'<tool_call>\n{{"name": "run_shell_command", "arguments": {{"command": "{cmd}"}}}}\n</tool_call>'
        for i, cmd in enumerate(("ls", "cat README.md"))
    ]
    for call, text in zip(main, [*expected, FINAL], strict=True):
        # the recorded output is exactly the script's tokens, then the stop token
        assert renderer.decode(call.output_ids[:-1]) == text
        assert call.output_ids[-1] in renderer.stop_token_ids
        assert len(call.output_logprobs) == len(call.output_ids)
