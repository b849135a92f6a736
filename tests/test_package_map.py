"""The package's rooms and the way their imports point (docs/how-it-works.md, "The map"): every import is
read from the source, lazy and type-only ones included, so an arrow that runs back up fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "polarproxy"

# room -> rooms it must never import (its own job, and the arrows point down)
FORBIDDEN = {
    "capture": {
        "harness",
        "control",
        "rollout",
        "commands",
        "cli",
        "export",
        "train",
        "reconstruct",
        "client",
    },
    "store": {"capture", "harness", "control", "rollout", "commands", "cli", "export", "train", "client"},
    "harness": {"control", "rollout", "commands", "cli", "export", "train"},
    "control": {"rollout", "commands", "cli", "train"},
    "dialects": {"capture", "harness", "control", "rollout", "store", "commands", "cli"},
    "render": {"capture", "harness", "control", "rollout", "store", "commands", "cli"},
    "backends": {"capture", "harness", "control", "rollout", "commands", "cli"},
}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return [(line, name) for line, name in out if name == "polarproxy" or name.startswith("polarproxy.")]


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_no_import_runs_back_up_from(room):
    wrong = []
    for path in sorted((PACKAGE / room).rglob("*.py")):
        for line, module in _imports(path):
            target = _room(module)
            if target in FORBIDDEN[room]:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}")
    assert not wrong, "\n".join(wrong)


def test_in_the_control_api_only_the_trajectory_stream_reads_exports():
    readers = {
        str(path.relative_to(PACKAGE.parent))
        for path in (PACKAGE / "control").rglob("*.py")
        for _, module in _imports(path)
        if _room(module) in {"export", "reconstruct"}
    }
    assert readers == {"polarproxy/control/stream.py"}


def test_each_class_name_is_declared_once_across_the_package():
    """Two public classes of one name (two `EpisodeHandle`s, two `RewardFrom`s) make a reader guess which one
    a module means."""
    seen: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                seen.setdefault(node.name, []).append(str(path.relative_to(PACKAGE.parent)))
    twice = {name: where for name, where in seen.items() if len(where) > 1}
    assert not twice, twice


def test_the_code_explains_itself_not_the_rounds_that_changed_it():
    """Docstrings and comments (of the package and its benches) say what the code does and why; they do not
    point at issue numbers, rounds of the benchmark journal, or docs/benchmarks.md (a page of current
    figures; a bench names where one is measured)."""
    journal = re.compile(
        r"issue[ #-]*[0-9]+|\b([a-z]+th|first|second|third|last) round\b|benchmarks\.md", re.IGNORECASE
    )
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
        for path in sorted([*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "bench").rglob("*.py")])
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if journal.search(line)
    ]
    assert not found, "\n".join(found)
