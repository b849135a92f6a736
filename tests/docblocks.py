"""The fenced code blocks of a Markdown page, and the labels that say a block is not run here.

Shared by the tests that run documentation as written (tests/test_docs_run.py, tests/export/
test_trainer_docs.py): a block whose first line is `# not run here: WHY` is only parsed, and must say why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

NOT_RUN = "# not run here:"
FENCE = re.compile(r"^```(\S*)")


@dataclass(frozen=True, slots=True)
class Block:
    page: str  # the page's file name
    line: int  # the line of its opening fence, from 1
    lang: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line} ({self.lang or 'no language'})"

    @property
    def skipped_because(self) -> str | None:
        first = self.code.split("\n", 1)[0]
        return first.removeprefix(NOT_RUN).strip() if first.startswith(NOT_RUN) else None


def code_blocks(page: Path) -> list[Block]:
    """The fenced blocks of a Markdown page (``` fences at the start of a line), in order."""
    blocks: list[Block] = []
    opened: tuple[int, str] | None = None
    body: list[str] = []
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        fence = FENCE.match(line)
        if opened is None and fence:
            opened, body = (number, fence.group(1)), []
        elif opened is not None and line.rstrip() == "```":
            blocks.append(Block(page.name, opened[0], opened[1], "\n".join(body) + "\n"))
            opened = None
        elif opened is not None:
            body.append(line)
    if opened is not None:
        raise ValueError(f"{page.name}:{opened[0]}: a code block is never closed.")
    return blocks
