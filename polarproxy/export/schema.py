"""Load the JSON Schemas of polarproxy's records and exports.

They live in `polarproxy/schemas/` (package data: a wheel ships them); the repository's top-level
`schemas/` is a link to that folder.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import orjson

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
SCHEMA_DIRS = (_PACKAGE_DIR / "schemas",)


def schema_path(name: str) -> Path:
    """The file of schema `name` ('export-row.v2' or 'export-row.v2.json')."""
    filename = name if name.endswith(".json") else name + ".json"
    for folder in SCHEMA_DIRS:
        path = folder / filename
        if path.is_file():
            return path
    available = sorted({p.stem for folder in SCHEMA_DIRS if folder.is_dir() for p in folder.glob("*.json")})
    raise FileNotFoundError(
        f"No schema {name!r} in {' or '.join(str(d) for d in SCHEMA_DIRS)}. "
        f"Available: {', '.join(available) or 'none (is this a source checkout or an editable install?)'}."
    )


@functools.cache
def _load(path: Path) -> bytes:
    return path.read_bytes()


def load_schema(name: str) -> dict[str, Any]:
    """The parsed JSON Schema `name`, e.g. load_schema('export-row.v2'). A fresh dict on every call."""
    return orjson.loads(_load(schema_path(name)))
