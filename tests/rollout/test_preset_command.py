"""Each built-in preset's headless `command` (what `rollout --harness NAME` runs): the instruction is one
argument however it is quoted, and a preset's command must take it."""

from __future__ import annotations

import pytest

from polarproxy.harness.presets import PresetError, builtin_presets, parse_preset
from polarproxy.rollout.sandbox import Runner
from polarproxy.rollout.stages import Settings, harness_command, harness_stdin


def test_every_builtin_preset_has_a_headless_command_taking_the_instruction() -> None:
    presets = builtin_presets()
    assert {"codex", "claude", "qwen", "gemini", "opencode", "pi", "aider"} <= set(presets)
    for name, preset in presets.items():
        assert preset.command and "{instruction}" in preset.command, name
    # Codex's own sandbox is read-only by default: under rollout it must be able to edit the workspace
    assert (
        presets["codex"].command == "codex exec --skip-git-repo-check --sandbox workspace-write {instruction}"
    )


def test_instruction_becomes_one_argument_with_its_quotes_and_spaces() -> None:
    s = Settings(
        rollout_id="r", episodes=None, runner=Runner(), command=None, preset=builtin_presets()["codex"]
    )  # type: ignore[arg-type]
    instruction = "Fix the bug; don't touch 'tests' && run $HOME"
    assert harness_command(s, instruction) == [
        "codex",
        "exec",
        "--skip-git-repo-check",
        "--sandbox",
        "workspace-write",
        instruction,
    ]
    assert harness_stdin(s, instruction) == b""  # given once, as the argument, not on stdin too
    # --harness-arg adds flags to the preset's command, before the instruction
    s.harness_args = ["--color", "never"]
    assert harness_command(s, instruction) == [
        "codex",
        "exec",
        "--skip-git-repo-check",
        "--sandbox",
        "workspace-write",
        "--color",
        "never",
        instruction,
    ]
    own = Settings(rollout_id="r", episodes=None, runner=Runner(), command=["agent"], preset=None)  # type: ignore[arg-type]
    assert harness_command(own, instruction) == ["agent"] and harness_stdin(own, instruction) == (
        instruction.encode() + b"\n"
    )  # a -- CMD agent reads the instruction on stdin


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("codex exec", "{instruction} as one whole argument"),
        ("run {instruction} {key}", "unknown placeholder {key}"),
    ],
)
def test_preset_command_without_the_instruction_or_with_unknown_placeholders_is_refused(
    command: str, why: str
) -> None:
    with pytest.raises(PresetError, match="field 'command'") as e:
        parse_preset({"name": "x", "command": command}, source="x.yaml", default_name="x")
    assert why in e.value.message
