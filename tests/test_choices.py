"""Each closed choice is declared once (polarproxy/choices.py): the CLI's enums are built from those tuples,
the library checks against them, and no module declares the same set of values again."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import pkgutil
from enum import StrEnum
from pathlib import Path

import pytest

from polarproxy import choices
from polarproxy.commands.enums import SOURCES

PACKAGE = Path(choices.__file__).parent
TUPLES = {name: value for name, value in vars(choices).items() if name.isupper() and isinstance(value, tuple)}


@pytest.mark.parametrize("enum", list(SOURCES), ids=lambda e: e.__name__)
def test_every_cli_enum_has_exactly_the_values_of_its_tuple(enum):
    assert tuple(member.value for member in enum) == SOURCES[enum]
    assert any(SOURCES[enum] is t for t in TUPLES.values())


def test_every_enum_a_command_uses_is_one_of_the_built_ones():
    """No command module declares an enum of its own (two `RewardFrom`s drifted apart that way)."""
    import polarproxy.commands

    found = set()
    for info in pkgutil.iter_modules(polarproxy.commands.__path__):
        module = importlib.import_module(f"polarproxy.commands.{info.name}")
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, StrEnum) and value is not StrEnum:
                found.add(value)
    assert found and found <= set(SOURCES), found - set(SOURCES)


def test_the_library_checks_against_the_same_tuples():
    from polarproxy.backends import selection
    from polarproxy.control import api
    from polarproxy.export import advantages, run, writers
    from polarproxy.render import output_parser, prefix
    from polarproxy.render.parsers import PARSERS, TOOL_FORMATS
    from polarproxy.rewards import verifier
    from polarproxy.rollout import sandbox
    from polarproxy.train import config, follow, sync

    assert selection.KINDS is choices.BACKEND_KINDS and selection.MODES is choices.BACKEND_MODES
    assert prefix.POLICIES is choices.PREFIX_POLICIES
    assert TOOL_FORMATS is choices.TOOL_FORMATS and tuple(PARSERS) == choices.TOOL_FORMATS
    assert output_parser.REASONING_FORMATS is choices.REASONING_FORMATS
    assert verifier.REWARD_FROM is choices.REWARD_FROM
    assert sandbox.ISOLATIONS is choices.ISOLATIONS
    assert run.FORMATS is choices.EXPORT_FORMATS and writers.FORMATS is choices.TOKEN_FORMATS
    assert advantages.ESTIMATORS is choices.ESTIMATORS and advantages.SCALES is choices.REWARD_SCALES
    assert api.STRATEGIES is choices.STRATEGIES and api.ESTIMATORS is choices.ESTIMATORS
    assert follow.FOLLOW_STRATEGIES is choices.STRATEGIES
    assert sync.SYNC_KINDS is choices.SYNC_KINDS and sync.PAUSE_MODES is choices.PAUSE_MODES
    for f in dataclasses.fields(config.TrainConfig):
        if f.metadata.get("choices") is not None:
            assert f.default in f.metadata["choices"], f.name


def test_no_module_declares_a_choice_set_again():
    sets = {frozenset(t): name for name, t in TUPLES.items()}
    again = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "choices.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Tuple | ast.List | ast.Set) or len(node.elts) < 2:
                continue
            if all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
                values = frozenset(e.value for e in node.elts)  # type: ignore[attr-defined]
                if values in sets and len(values) == len(node.elts):
                    again.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} repeats {sets[values]}")
    assert not again, "\n".join(again)
