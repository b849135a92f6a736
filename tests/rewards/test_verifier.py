"""The verifier command runner: its environment and folder, rewards from the exit code or the last stdout
line, a timeout that ends the whole process group, and the command line stored without secrets."""

from __future__ import annotations

import os
import re
import time

import pytest

from polarproxy.rewards import RewardParseError, Verifier, parse_reward_output, run_verifier
from polarproxy.rewards import verifier as verifier_module
from polarproxy.rewards.redact import redact_command


def _run(tmp_path, command, reward_from="exit", timeout_s=30.0, rc=0):
    return run_verifier(
        Verifier(command, reward_from, timeout_s),
        cwd=tmp_path,
        env={"PATH": os.environ["PATH"], "HARNESS_VAR": "kept"},
        episode_id="ep_verify",
        harness_exit_code=rc,
    )


def test_exit_zero_is_one_and_anything_else_zero_with_the_episode_and_exit_code_in_the_env(tmp_path):
    (tmp_path / "marker").write_text("")
    ok = _run(
        tmp_path,
        'test -f marker && test "$POLARPROXY_EPISODE" = ep_verify && test "$POLARPROXY_EXIT_CODE" = 3 '
        '&& test "$HARNESS_VAR" = kept && echo passed',
        rc=3,
    )
    assert (ok.reward, ok.exit_code, ok.timed_out, ok.set_episode) == (1.0, 0, False, True)
    assert ok.output_tail == "passed\n" and ok.origin().source == "command"
    failed = _run(tmp_path, "echo nope, key sk-proj-abcdefghijklmnopqrstuvwx >&2; exit 4")
    assert (failed.reward, failed.exit_code) == (0.0, 4)
    assert "--- stderr ---\nnope, key <redacted>" in failed.output_tail and failed.origin().exit_code == 4


def test_stdout_gives_a_number_or_json_with_per_call_rewards_from_its_last_line(tmp_path):
    r = _run(tmp_path, "echo running tests; echo 0.75", "stdout")
    assert (r.reward, r.calls, r.set_episode) == (0.75, {}, True)
    r = _run(
        tmp_path,
        """echo log; printf '{"reward": 0.5, "calls": {"0": 1, "2": -1.5}}\\n\\n'; exit 1""",
        "stdout",
    )
    assert (r.reward, r.calls, r.exit_code) == (0.5, {0: 1.0, 2: -1.5}, 1)
    r = _run(tmp_path, """echo '{"calls": {"1": 0.25}}'""", "stdout")
    assert (r.reward, r.set_episode, r.calls) == (None, False, {1: 0.25})


def test_stdout_without_a_readable_reward_gives_none_and_says_why(tmp_path):
    r = _run(tmp_path, "echo all good", "stdout")
    assert r.reward is None and r.set_episode
    assert "'all good', is neither a number nor JSON" in r.note
    for text, why in (
        ("", "stdout is empty"),
        ("nan", "not a finite number"),
        ('{"reward": true}', "not a finite number"),
        ('{"score": 1}', "unknown keys ['score']"),
        ('{"calls": {"first": 1}}', "call number 'first' is not an integer"),
        ('{"calls": {"-1": 1}}', "negative"),
        ("[1]", "is not a finite number"),
    ):
        with pytest.raises(RewardParseError, match=re.escape(why)):
            parse_reward_output(text)


def test_a_verifier_past_its_timeout_is_killed_with_its_children_and_gives_zero(tmp_path, monkeypatch):
    monkeypatch.setattr(verifier_module, "KILL_GRACE_S", 1.0)
    t0 = time.monotonic()
    r = _run(tmp_path, "sleep 60 & echo $! > child.pid; echo started; wait", timeout_s=0.5)
    assert time.monotonic() - t0 < 10
    assert (r.reward, r.timed_out, r.exit_code) == (0.0, True, None)
    assert r.note.startswith("timeout: the verifier ran past 0.5 s") and "started" in r.output_tail
    child = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the verifier's child {child} outlived the timeout")


def test_the_stored_command_line_has_no_secrets():
    line = redact_command(
        "OPENAI_API_KEY=sk-abcdefghijkl ./check.sh --token s3cret --url postgresql://u:pw@h/db ok"
    )[2]
    assert "sk-abcdefghijkl" not in line and "s3cret" not in line and "pw@" not in line
    assert line == (
        "'OPENAI_API_KEY=<redacted>' ./check.sh --token '<redacted>' --url 'postgresql://u:<redacted>@h/db' ok"
    )
    assert redact_command("pytest -q tests/") == ["/bin/sh", "-c", "pytest -q tests/"]


def test_bad_verifier_settings_are_refused():
    with pytest.raises(ValueError, match="empty"):
        Verifier("  ")
    with pytest.raises(ValueError, match="Unknown reward source 'stderr'"):
        Verifier("true", "stderr")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        Verifier("true", "exit", 0)


def test_a_graders_last_line_with_tests_is_kept_unless_it_disagrees_with_the_reward(tmp_path):
    line = '{"resolved": %s, "parser": "pytest -rA", "tests": {"t::a": "%s"}}'
    kept = _run(tmp_path, "echo 'tests ran'; echo '" + line % ("true", "PASSED") + "'")
    assert kept.reward == 1.0 and kept.grading == {
        "resolved": True,
        "parser": "pytest -rA",
        "tests": {"t::a": "PASSED"},
    }
    assert kept.origin().grading == kept.grading
    # a grader that crashed after the tests printed a line of their own making: exit 1, "resolved": true
    forged = _run(tmp_path, "echo '" + line % ("true", "PASSED") + "'; exit 1")
    assert (
        forged.reward == 0.0
        and forged.grading is None
        and "disagree with the reward: not kept" in forged.note
    )
    assert _run(tmp_path, "echo '{\"tests\": [1]}'").grading is None  # not the shape: nothing kept
