"""Harness presets: what one harness CLI needs to talk to polarproxy, as a small YAML data file.

A preset names environment variables to set (`env`) and to remove (`unset`), and config files to write
(`files`, paths relative to a throwaway config home that is removed after the run). Strings may hold the
placeholders `{proxy_url}` (`http://127.0.0.1:PORT`, no path), `{key}` (the placeholder API key),
`{model}` (the model name the harness is told to use) and `{home}` (the throwaway config home). A preset
that speaks several wire formats lists them under `apis` (chosen with `record --api`); each entry's
values are extra placeholders. The built-in presets are `polarproxy/harness/builtin/*.yaml`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from polarproxy.errors import UsageError

BASE_PLACEHOLDERS = ("proxy_url", "key", "model", "home")
FIELDS = ("name", "description", "env", "unset", "files", "apis", "default_api", "command")
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class PresetError(UsageError):
    """A preset that cannot be used: unknown, unreadable or malformed."""


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    env: dict[str, str]
    unset: tuple[str, ...]
    files: dict[str, str]  # path relative to the config home -> content
    apis: dict[str, dict[str, str]]  # --api choice -> extra placeholders
    default_api: str | None
    source: str
    # the headless command line of `rollout --harness NAME`: {instruction} (one whole argument) is the
    # task's instruction, {model} the model name
    command: str | None = None

    def choose_api(self, api: str | None) -> str | None:
        """The `--api` choice to use: `api` if this preset offers it, else the preset's default."""
        if not self.apis:
            if api is not None:
                raise PresetError(
                    f"preset '{self.name}' speaks one wire format; --api {api} does not apply.",
                    hint="Drop --api, or use a preset with an 'apis' section (e.g. --harness pi).",
                )
            return None
        if api is None:
            return self.default_api
        if api not in self.apis:
            raise PresetError(
                f"preset '{self.name}' has no API '{api}'.", hint=f"Choose one of: {', '.join(self.apis)}."
            )
        return api

    def render(
        self, *, proxy_url: str, key: str, model: str, home: Path, api: str | None = None
    ) -> RenderedPreset:
        """Fill the placeholders. Files come back as absolute paths under `home`."""
        values = {"proxy_url": proxy_url, "key": key, "model": model, "home": str(home)}
        chosen = self.choose_api(api)
        if chosen is not None:
            extra = {k: _fill(v, values) for k, v in self.apis[chosen].items()}
            values = {**extra, **values}
        return RenderedPreset(
            env={k: _fill(v, values) for k, v in self.env.items()},
            unset=self.unset,
            files={home / rel: _fill(text, values) for rel, text in self.files.items()},
            api=chosen,
        )


@dataclass(frozen=True)
class RenderedPreset:
    env: dict[str, str]
    unset: tuple[str, ...]
    files: dict[Path, str]
    api: str | None

    def write_files(self) -> None:
        for path, text in self.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def apply_env(self, base: dict[str, str]) -> dict[str, str]:
        env = {k: v for k, v in base.items() if k not in self.unset}
        env.update(self.env)
        return env


def _fill(text: str, values: dict[str, str]) -> str:
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def parse_preset(data: Any, *, source: str, default_name: str) -> Preset:
    """Validate a loaded YAML document; a wrong field raises PresetError naming it."""
    label = default_name
    if isinstance(data, dict) and isinstance(data.get("name"), str):
        label = data["name"]

    def bad(field: str, what: str) -> PresetError:
        return PresetError(f"preset '{label}': field '{field}' {what}", hint=f"Fix {source}.")

    if not isinstance(data, dict):
        raise PresetError(f"preset '{label}': must be a mapping of fields", hint=f"Fix {source}.")
    for k in data:
        if k not in FIELDS:
            raise bad(str(k), f"is unknown (known fields: {', '.join(FIELDS)})")
    name = data.get("name", default_name)
    if not isinstance(name, str) or not _NAME.match(name):
        raise bad("name", "must be a string of letters, digits, '.', '_' or '-'")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise bad("description", "must be a string")

    env = _str_map(data.get("env", {}), "env", bad)
    for k in env:
        if not _ENV_NAME.match(k):
            raise bad(f"env.{k}", "is not a valid environment variable name")
    unset = data.get("unset", [])
    if not isinstance(unset, list):
        raise bad("unset", "must be a list of variable names")
    for i, v in enumerate(unset):
        if not isinstance(v, str) or not _ENV_NAME.match(v):
            raise bad(f"unset[{i}]", "must be an environment variable name")
    files = _str_map(data.get("files", {}), "files", bad)
    for rel in files:
        p = PurePosixPath(rel)
        if not rel or p.is_absolute() or ".." in p.parts:
            raise bad(f"files.{rel}", "must be a path relative to the config home, without '..'")

    apis_raw = data.get("apis", {})
    if not isinstance(apis_raw, dict):
        raise bad("apis", "must be a mapping of API name to placeholder values")
    apis = {str(a): _str_map(v, f"apis.{a}", bad) for a, v in apis_raw.items()}
    default_api = data.get("default_api", next(iter(apis), None))
    if apis and (not isinstance(default_api, str) or default_api not in apis):
        raise bad("default_api", f"must be one of: {', '.join(apis)}")
    command = data.get("command")
    if command is not None:
        import shlex

        try:
            parts = shlex.split(command) if isinstance(command, str) else []
        except ValueError:
            parts = []
        if "{instruction}" not in parts:
            raise bad("command", "must be a command line with {instruction} as one whole argument")
        for m in _PLACEHOLDER.finditer(command):
            if m.group(1) not in ("instruction", "model"):
                raise bad(
                    "command", f"uses unknown placeholder {m.group(0)} (known: {{instruction}}, {{model}})"
                )
    if not apis and "default_api" in data:
        raise bad("default_api", "needs an 'apis' section")

    known = set(BASE_PLACEHOLDERS)
    if apis:
        known |= set.intersection(*(set(v) for v in apis.values()))
    templates = [(f"env.{k}", v) for k, v in env.items()] + [(f"files.{k}", v) for k, v in files.items()]
    templates += [(f"apis.{a}.{k}", v) for a, vs in apis.items() for k, v in vs.items()]
    for field, text in templates:
        allowed = set(BASE_PLACEHOLDERS) if field.startswith("apis.") else known
        for m in _PLACEHOLDER.finditer(text):
            if m.group(1) not in allowed:
                raise bad(
                    field, f"uses unknown placeholder {m.group(0)} (known: {', '.join(sorted(allowed))})"
                )
    return Preset(
        name=name,
        description=description,
        env=env,
        unset=tuple(unset),
        files=files,
        apis=apis,
        default_api=default_api if apis else None,
        source=source,
        command=command,
    )


def _str_map(value: Any, field: str, bad: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise bad(field, "must be a mapping of names to strings")
    for k, v in value.items():
        if not isinstance(k, str):
            raise bad(f"{field}.{k}", "must have a string name")
        if not isinstance(v, str):
            raise bad(f"{field}.{k}", "must be a string (quote values such as true, 1 or null)")
    return dict(value)


def _load_text(text: str, *, source: str, default_name: str) -> Preset:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PresetError(f"preset '{default_name}': not valid YAML: {e}", hint=f"Fix {source}.") from e
    return parse_preset(data, source=source, default_name=default_name)


def load_preset_file(path: Path) -> Preset:
    """A user's preset file (`record --harness-file FILE`); its name defaults to the file's stem."""
    try:
        text = path.read_text()
    except OSError as e:
        raise PresetError(
            f"Cannot read the preset file '{path}': {e.strerror}.",
            hint="Pass --harness-file PATH to a YAML file.",
        ) from e
    return _load_text(text, source=str(path), default_name=path.stem)


def builtin_presets() -> dict[str, Preset]:
    """The presets shipped with polarproxy, by name."""
    out: dict[str, Preset] = {}
    folder = resources.files("polarproxy.harness") / "builtin"
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            stem = entry.name[: -len(".yaml")]
            p = _load_text(
                entry.read_text(), source=f"polarproxy/harness/builtin/{entry.name}", default_name=stem
            )
            out[p.name] = p
    return out


def get_preset(name: str) -> Preset:
    """A built-in preset by name; an unknown name lists the known ones."""
    presets = builtin_presets()
    if name not in presets:
        raise PresetError(
            f"No harness preset '{name}'. Known presets: {', '.join(presets)}.",
            hint="Pass one of those to --harness, or write your own and pass --harness-file FILE "
            "(see docs/usage.md).",
        )
    return presets[name]
