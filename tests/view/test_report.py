"""`polarproxy view --export EPISODE --out FILE.html`: one self-contained file that opens offline (every
network request refused) and shows what the live page shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner
from view_fixtures import Built, Page, ViewServer

from polarproxy.cli import app


@pytest.fixture(scope="module")
def report(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "episode.html"
    res = CliRunner().invoke(
        app,
        [
            "view",
            "--db",
            str(built.db),
            "--metrics",
            str(built.metrics_dir),
            "--export",
            built.main,
            "--out",
            str(out),
        ],
        catch_exceptions=False,
    )
    assert res.exit_code == 0, res.output
    assert f"episode {built.main}, 5 calls, 3 trajectories" in res.output
    return out


def test_report_references_nothing_outside_itself(report: Path):
    text = report.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//|static/)""", text)
    assert "default-src 'none'" in text  # its policy forbids any request
    assert text.count("<script") == 2  # the data (JSON, not run) and the app


def _offline(page: Page, report: Path) -> list[str]:
    """Open the report with every request but the file itself refused; returns the URLs requested."""
    requested: list[str] = []

    def handle(route):
        requested.append(route.request.url)
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            route.abort()

    page.page.route("**/*", handle)
    page.open(report.as_uri())
    return requested


def _text(pg, selector: str) -> list[list[str]]:
    return pg.eval_on_selector_all(
        selector + " tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent.trim()))"
    )


def test_report_opens_offline_with_the_live_pages_content(
    page: Page, browser, report: Path, view_server: ViewServer, built: Built, cli_json
):
    live = browser.new_page(viewport={"width": 1280, "height": 900})
    views = {
        f"#/episode/{built.main}": "#calls",
        f"#/audit/{built.main}": "#audit-calls",
        f"#/trajectory/{built.main}/1": None,
        f"#/call/{built.main_calls[0]}": None,
        f"#/tree/{built.main}": None,
    }
    expected = {}
    live_page = Page(live, page.errors, page.shots)
    live_page.open(view_server.url)
    for hash_, table in views.items():
        live_page.go(hash_)
        expected[hash_] = (
            _text(live, table) if table else None,
            live.eval_on_selector_all(".tokens .t, #tree li.node", "ts => ts.map(t => t.dataset.id)"),
        )
    live.close()
    requested = _offline(page, report)
    pg = page.page
    assert pg.evaluate("document.body.dataset.view") == "episode"  # the report opens on its episode
    page.shot("report-episode")
    for hash_, table in views.items():
        page.go(hash_)
        rows, ids = expected[hash_]
        if table:
            assert _text(pg, table) == rows, hash_
        assert (
            pg.eval_on_selector_all(".tokens .t, #tree li.node", "ts => ts.map(t => t.dataset.id)") == ids
        ), hash_
    call = cli_json("show", built.main, "--tokens")["calls"][0]
    page.go(f"#/call/{call['id']}")
    assert [int(x) for x in pg.eval_on_selector_all(".tokens .t", "ts => ts.map(t => t.dataset.id)")] == (
        call["prompt_ids"] + call["output_ids"]
    )
    page.go("#/groups")
    assert pg.eval_on_selector_all("table.group", "ts => ts.map(t => t.dataset.key)") == ["group:g1"]
    page.go("#/metrics")
    assert pg.locator("svg.chart").count() == 4
    page.shot("report-metrics")
    page.go("#/episode/ep_elsewhere")
    assert "does not include" in pg.text_content("main")
    assert requested == [report.as_uri()]
    page.assert_no_errors()


def test_export_needs_out_and_a_known_episode(built: Built, tmp_path: Path):
    res = CliRunner().invoke(app, ["view", "--db", str(built.db), "--export", built.main])
    assert res.exit_code == 2 and "--out" in res.output
    res = CliRunner().invoke(
        app, ["view", "--db", str(built.db), "--export", "ep_nope", "--out", str(tmp_path / "r.html")]
    )
    assert res.exit_code == 1 and "Error:" in res.output and "ep_nope" in res.output
    assert not (tmp_path / "r.html").exists()
