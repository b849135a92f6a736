"""Harness presets: the shipped YAML files, the validator's refusals, and `record --harness` end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from factories import record_summary

from polarproxy.harness.presets import (
    PresetError,
    builtin_presets,
    get_preset,
    load_preset_file,
    parse_preset,
)

CLI = [sys.executable, "-m", "polarproxy"]
URL = "http://127.0.0.1:4321"


def render(name: str, home: Path, **kw):
    return get_preset(name).render(proxy_url=URL, key="sk-test", model="tiny", home=home, **kw)


def test_the_shipped_presets_load_and_fill_every_placeholder(tmp_path):
    presets = builtin_presets()
    assert set(presets) == {"codex", "claude", "qwen", "gemini", "opencode", "pi", "aider"}
    for name, preset in presets.items():
        assert preset.description, name
        r = preset.render(proxy_url=URL, key="sk-test", model="tiny", home=tmp_path)
        for text in [*r.env.values(), *r.files.values()]:
            assert "{proxy_url}" not in text and "{key}" not in text and "{model}" not in text, name
        for path, text in r.files.items():
            assert path.is_relative_to(tmp_path)
            if path.suffix == ".json":
                json.loads(text)
            if path.suffix == ".toml":
                tomllib.loads(text)


def test_codex_gets_a_provider_on_the_responses_api_in_its_own_config_home(tmp_path):
    r = render("codex", tmp_path)
    assert r.env["CODEX_HOME"] == str(tmp_path / ".codex")
    cfg = tomllib.loads(r.files[tmp_path / ".codex" / "config.toml"])
    provider = cfg["model_providers"][cfg["model_provider"]]
    assert cfg["model"] == "tiny" and provider["base_url"] == URL + "/v1"
    assert provider["wire_api"] == "responses" and r.env[provider["env_key"]] == "sk-test"


def test_claude_points_at_the_proxy_and_drops_a_bearer_token(tmp_path):
    r = render("claude", tmp_path)
    assert r.env["ANTHROPIC_BASE_URL"] == URL and r.env["ANTHROPIC_API_KEY"] == "sk-test"
    assert r.env["ANTHROPIC_MODEL"] == "tiny"
    env = r.apply_env({"ANTHROPIC_AUTH_TOKEN": "real", "PATH": "/bin"})
    assert "ANTHROPIC_AUTH_TOKEN" not in env and env["PATH"] == "/bin"


@pytest.mark.parametrize(
    "api, pi_api, base",
    [
        (None, "openai-completions", URL + "/v1"),
        ("chat", "openai-completions", URL + "/v1"),
        ("responses", "openai-responses", URL + "/v1"),
        ("anthropic", "anthropic-messages", URL),
        ("gemini", "google-generative-ai", URL + "/v1beta"),
    ],
)
def test_pi_speaks_the_api_chosen_with_api(tmp_path, api, pi_api, base):
    r = render("pi", tmp_path, api=api)
    provider = json.loads(r.files[tmp_path / ".pi" / "agent" / "models.json"])["providers"]["polarproxy"]
    assert provider["api"] == pi_api and provider["baseUrl"] == base and provider["models"][0]["id"] == "tiny"


def test_api_choices_are_checked():
    with pytest.raises(PresetError, match="no API 'grpc'") as e:
        get_preset("pi").choose_api("grpc")
    assert "chat, responses, anthropic, gemini" in (e.value.hint or "")
    with pytest.raises(PresetError, match="--api chat does not apply"):
        get_preset("codex").choose_api("chat")


def test_an_unknown_name_lists_the_known_presets():
    with pytest.raises(PresetError) as e:
        get_preset("nope")
    assert "No harness preset 'nope'" in e.value.message
    assert "claude, codex, gemini" in e.value.message


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"env": {"FOO": 1}}, "preset 'x': field 'env.FOO' must be a string"),
        ({"env": {"FOO": True}}, "field 'env.FOO' must be a string"),
        ({"env": ["FOO"]}, "field 'env' must be a mapping"),
        ({"env": {"1BAD": "x"}}, "field 'env.1BAD' is not a valid environment variable name"),
        ({"unset": "FOO"}, "field 'unset' must be a list"),
        ({"files": {"/etc/passwd": "x"}}, "field 'files./etc/passwd' must be a path relative"),
        ({"files": {"../up": "x"}}, "field 'files.../up' must be a path relative"),
        ({"files": {"a.json": "{proxy}"}}, "field 'files.a.json' uses unknown placeholder {proxy}"),
        ({"nmae": "x"}, "field 'nmae' is unknown"),
        ({"name": "a b"}, "field 'name' must be a string of letters"),
        ({"apis": {"a": {"v": "1"}}, "default_api": "b"}, "field 'default_api' must be one of: a"),
        ({"default_api": "a"}, "field 'default_api' needs an 'apis' section"),
        (
            {"apis": {"a": {"v": "1"}, "b": {}}, "env": {"X": "{v}"}},
            "field 'env.X' uses unknown placeholder {v}",
        ),
        ([1, 2], "preset 'x': must be a mapping"),
    ],
)
def test_a_malformed_preset_is_refused_naming_the_field(doc, message):
    with pytest.raises(PresetError) as e:
        parse_preset(doc, source="x.yaml", default_name="x")
    assert message in e.value.message


def test_a_preset_file_takes_its_name_from_the_file_and_braces_in_json_stay(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text(
        'env:\n  MY_URL: "{proxy_url}/v1"\nfiles:\n  a/b.json: \'{"url": "{proxy_url}", "n": {}}\'\n'
    )
    p = load_preset_file(f)
    assert p.name == "mine"
    r = p.render(proxy_url=URL, key="k", model="m", home=tmp_path / "h")
    assert r.env == {"MY_URL": URL + "/v1"}
    assert json.loads(r.files[tmp_path / "h" / "a" / "b.json"]) == {"url": URL, "n": {}}
    (tmp_path / "bad.yaml").write_text("env: [unclosed\n")
    with pytest.raises(PresetError, match="not valid YAML"):
        load_preset_file(tmp_path / "bad.yaml")


def _record(args, tmp_path, *cmd):
    return subprocess.run(
        [*CLI, "record", *args, "--db", str(tmp_path / "r.db"), "--json", "--", *cmd],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.integration
def test_record_with_a_preset_file_writes_its_files_sets_its_env_and_cleans_up(
    make_stub, tiny_model_dir, tmp_path
):
    stub = make_stub()
    preset = tmp_path / "probe.yaml"
    preset.write_text(
        "name: probe\n"
        "env:\n  HOME: '{home}'\n  PROBE_MODEL: '{model}'\n  PROBE_KEY: '{key}'\n"
        "unset: [PROBE_GONE]\n"
        'files:\n  .probe/conf.json: \'{"base": "{proxy_url}/v1"}\'\n'
    )
    script = (
        "import json, os, pathlib; h = pathlib.Path(os.environ['HOME']);"
        "print(json.dumps({'home': str(h), 'conf': json.loads((h / '.probe/conf.json').read_text()),"
        " 'model': os.environ['PROBE_MODEL'], 'key': os.environ['PROBE_KEY'], 'gone': 'PROBE_GONE' in os.environ,"
        " 'url': os.environ['POLARPROXY_URL'], 'openai': os.environ['OPENAI_BASE_URL']}))"
    )
    args = ["--backend", stub.url, "--model", str(tiny_model_dir), "--harness-file", str(preset)]
    args += [
        "--model-name",
        "m1",
        "--db",
        str(tmp_path / "r.db"),
        "--json",
        "--",
        sys.executable,
        "-c",
        script,
    ]
    r = subprocess.run(
        [*CLI, "record", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PROBE_GONE": "1"},
    )
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.splitlines()[0])
    assert seen["conf"] == {"base": seen["url"] + "/v1"} and seen["openai"] == seen["url"] + "/v1"
    assert seen["model"] == "m1" and seen["key"] == "sk-polarproxy-local" and not seen["gone"]
    assert not Path(seen["home"]).exists()  # the throwaway config home is removed after the run
    from polarproxy.store.store import Store

    summary = record_summary(r.stderr)
    episode = Store.open(str(tmp_path / "r.db")).get_episode(summary["episode_id"])
    assert episode.harness == "probe" and episode.metadata["model_name"] == "m1"


@pytest.mark.integration
@pytest.mark.parametrize(
    "args, message, hint, code",
    [
        (
            ["--harness", "nope"],
            "Error: No harness preset 'nope'. Known presets: aider, claude, codex",
            "--harness-file",
            1,
        ),
        (["--harness", "pi", "--api", "grpc"], "Error: preset 'pi' has no API 'grpc'.", "chat, responses", 1),
        (["--api", "chat"], "Error: --api needs a harness preset.", "--harness pi", 2),  # a usage error
        (["--harness", "codex", "--api", "chat"], "--api chat does not apply", "Drop --api", 1),
    ],
)
def test_bad_preset_choices_are_refused_before_start(args, message, hint, code, tmp_path):
    r = _record([*args, "--backend", "http://127.0.0.1:9", "--model", "."], tmp_path, "true")
    assert r.returncode == code, r.stderr
    assert message in r.stderr and hint in r.stderr


@pytest.mark.integration
def test_a_malformed_preset_file_is_refused_with_the_field(tmp_path):
    bad = tmp_path / "x.yaml"
    bad.write_text("env:\n  FOO: 1\n")
    r = _record(
        ["--harness-file", str(bad), "--backend", "http://127.0.0.1:9", "--model", "."], tmp_path, "true"
    )
    assert r.returncode == 1
    assert "Error: preset 'x': field 'env.FOO' must be a string" in r.stderr


def test_codex_home_is_not_under_the_childs_temporary_folder(tmp_path):
    """Codex refuses to create its sandbox helper (codex-linux-sandbox) when CODEX_HOME lies under the
    temporary folder; the throwaway home is one, so the child's TMPDIR is a folder of its own."""
    r = render("codex", tmp_path)
    r.write_files()
    tmp = Path(r.env["TMPDIR"])
    assert tmp.is_dir() and not Path(r.env["CODEX_HOME"]).is_relative_to(tmp)


def test_pi_defaults_to_the_proxy_provider_and_model(tmp_path):
    """`pi -p "P"` needs no --provider/--model: settings.json names the preset's provider and model."""
    r = render("pi", tmp_path)
    settings = json.loads(r.files[tmp_path / ".pi" / "agent" / "settings.json"])
    models = json.loads(r.files[tmp_path / ".pi" / "agent" / "models.json"])
    assert settings["defaultProvider"] in models["providers"] and settings["defaultModel"] == "tiny"
    assert r.env["PI_CODING_AGENT_DIR"] == str(tmp_path / ".pi" / "agent")


def test_claude_is_told_it_runs_in_a_sandbox_so_root_may_skip_permissions(tmp_path):
    assert render("claude", tmp_path).env["IS_SANDBOX"] == "1"
