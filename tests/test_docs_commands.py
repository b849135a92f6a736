"""Every `polarproxy ...` line in the fenced blocks of README.md and docs/ parses against today's CLI: the
command exists, each option is one it takes, each closed choice is one it allows, each number is a number.

Docs drift where nothing runs them; tests/test_readme.py runs the README's "By hand" block,
tests/test_docs_run.py and tests/export/test_trainer_docs.py the CPU-runnable blocks of docs/, and those
needing a GPU, Docker, Apptainer or a harness CLI are labelled in their page as not run here. This test is
the net under all of them, labelled blocks and prose included: it runs nothing, it only parses (click's own
parser, as `polarproxy` would).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer

from polarproxy.cli import make_app

try:  # typer 0.26-0.28 carry their own click (setup.cfg's range); older ones use click's
    from typer import _click as click
except ImportError:
    import click  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def command_lines(page: Path) -> list[tuple[int, str]]:
    """(line number, command) of each `polarproxy` command in the page's fenced blocks; `\\` continues."""
    out: list[tuple[int, str]] = []
    in_block = False
    pending: tuple[int, str] | None = None
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_block = not in_block
            continue
        if not in_block:
            continue
        if pending is not None:
            pending = (pending[0], pending[1] + " " + line.strip())
        elif re.match(r"^\s*(\$ )?polarproxy ", line):
            pending = (number, line.strip().removeprefix("$ "))
        if pending is not None and not pending[1].endswith("\\"):
            out.append(pending)
            pending = None
        elif pending is not None:
            pending = (pending[0], pending[1][:-1])
    return out


CASES = [(page, number, line) for page in PAGES for number, line in command_lines(page)]


def words_of(line: str) -> list[str]:
    """The argv of one shell line: its comment dropped, up to a pipe, `&&`, `&` or a redirection."""
    words = shlex.split(line, comments=True)
    for i, w in enumerate(words):
        if w in ("|", "&&", "&", ";", ">", "2>&1") or w.startswith((">", "2>")):
            return words[:i]
    return words


def parse(args: list[str]) -> None:
    """Parse `polarproxy ARGS` down to its leaf command, as click does when the command runs."""
    command = typer.main.get_command(make_app())
    name = "polarproxy"
    while True:
        ctx = command.make_context(name, list(args), resilient_parsing=False)
        if not hasattr(command, "resolve_command"):
            return
        rest = [*getattr(ctx, "_protected_args", getattr(ctx, "protected_args", [])), *ctx.args]
        assert rest, f"`{name}` needs a subcommand"
        name, sub, args = command.resolve_command(ctx, rest)
        assert sub is not None, f"no command {rest[0]!r} under `{name}`"
        command = sub


def test_the_pages_hold_commands() -> None:
    assert len(CASES) > 40, [c[0].name for c in CASES]


@pytest.mark.parametrize(("page", "number", "line"), CASES, ids=[f"{p.name}:{n}" for p, n, _ in CASES])
def test_each_documented_command_parses(page: Path, number: int, line: str) -> None:
    try:
        parse(words_of(line)[1:])
    except typer.Exit:  # --help
        pass
    except click.exceptions.UsageError as e:
        pytest.fail(f"{page.relative_to(REPO)}:{number}: {line}\n{e.format_message()}")
