"""Fixtures for the audit tests: the tiny model's renderer and a real SQLite store."""

from __future__ import annotations

from pathlib import Path

import pytest

from polarproxy.render.renderer import Renderer
from polarproxy.store import Store


@pytest.fixture(scope="session")
def renderer(tiny_model_dir: Path) -> Renderer:
    return Renderer(tiny_model_dir)


@pytest.fixture
def store(tmp_path: Path):
    s = Store.open(tmp_path / "audit.db")
    yield s
    s.close()
