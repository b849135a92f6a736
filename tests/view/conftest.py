"""Fixtures of the viewer tests: the store (view_fixtures.build_store), the CLI's JSON, `polarproxy view`
serving the store as a real subprocess on loopback, and headless Chromium driven by Playwright (Debian's
`chromium`; outside CI a missing one skips the browser tests, with CI=true it fails them)."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from view_fixtures import (
    CHROMIUM,
    CHROMIUM_ARGS,
    Built,
    Page,
    ViewServer,
    build_store,
    chromium_missing,
    start_view,
)


@pytest.fixture(scope="session")
def built(random_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Built:
    root = tmp_path_factory.mktemp("view")
    return build_store(root / "view.db", random_model_dir, root / "train-out")


@pytest.fixture(scope="session")
def cli_json(built: Built):
    """cli_json(*args) -> the parsed stdout of `polarproxy ARGS --json` against the test store."""
    from typer.testing import CliRunner

    from polarproxy.cli import app

    def run(*args: str) -> Any:
        res = CliRunner().invoke(app, [*args, "--db", str(built.db), "--json"], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)

    return run


@pytest.fixture(scope="session")
def view_server(built: Built) -> Iterator[ViewServer]:
    server = start_view("--db", str(built.db), "--metrics", str(built.metrics_dir))
    yield server
    server.proc.terminate()
    try:
        server.proc.wait(10)
    except subprocess.TimeoutExpired:
        server.proc.kill()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless Chromium. Outside CI a missing Chromium or Playwright skips; with CI=true it fails."""
    missing = chromium_missing()
    if missing:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"The viewer's browser tests need Chromium: {missing}.")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, tmp_path: Path) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    shots = Path(os.environ.get("POLARPROXY_VIEW_SHOTS", tmp_path / "shots"))
    shots.mkdir(parents=True, exist_ok=True)
    yield Page(pg, errors, shots)
    context.close()
