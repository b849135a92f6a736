"""`polarproxy view`: a read-only web page over the store, on loopback; `--export` writes one episode's
pages as a self-contained HTML file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from polarproxy.commands.support import DbOpt, ModelOpt, NothingRecorded, fail, open_store, usage_fail

if TYPE_CHECKING:
    from polarproxy.view.data import ViewData

DEFAULT_PORT = 8420


def view(
    db: DbOpt = None,
    port: Annotated[int, typer.Option("--port", help="Port on loopback (0: any free port).")] = DEFAULT_PORT,
    host: Annotated[
        str, typer.Option("--host", help="Loopback address to listen on: 127.0.0.1, ::1 or localhost.")
    ] = "127.0.0.1",
    open_browser: Annotated[
        bool, typer.Option("--open", help="Open the page in a browser, if there is one.")
    ] = False,
    metrics: Annotated[
        Path | None,
        typer.Option("--metrics", help="A `polarproxy train` output folder: its metrics.jsonl as curves."),
    ] = None,
    model: ModelOpt = None,
    export: Annotated[
        str | None,
        typer.Option(
            "--export", metavar="EPISODE", help="Write this episode's pages as one HTML file (with --out)."
        ),
    ] = None,
    out: Annotated[Path | None, typer.Option("--out", help="The HTML file --export writes.")] = None,
) -> None:
    """Browse episodes, calls, tokens, trajectories, audits, groups and training curves in a local web page."""
    from polarproxy.view.data import ViewData

    if export is None and out is not None:
        usage_fail(
            "--out needs --export EPISODE.",
            "Write a report with `polarproxy view --export EPISODE --out FILE.html`.",
        )
    if export is not None and out is None:
        usage_fail(
            "--export needs --out FILE.html.",
            "Write a report with `polarproxy view --export EPISODE --out FILE.html`.",
        )
    if not 0 <= port <= 65535:
        usage_fail(f"--port {port} is not a port number.", "Use 0..65535 (0: any free port).")
    if metrics is not None and not metrics.is_dir():
        fail(
            f"--metrics '{metrics}' is not a folder.",
            "Pass the output folder of `polarproxy train` (it holds metrics.jsonl).",
        )
    if model is not None and not model.is_dir():
        fail(f"--model '{model}' is not a folder.", "Pass a model folder (tokenizer + chat template).")
    if export is None:
        from polarproxy.loopback import is_loopback

        if not is_loopback(host):
            usage_fail(
                f"--host {host!r} is not a loopback address.",
                "The viewer listens on loopback only: 127.0.0.1 (the default), ::1 or localhost.",
            )
    try:
        store = open_store(db, create=False)
    except NothingRecorded:
        fail(
            "No episode has been recorded yet: there is nothing to view.",
            "Record one with `polarproxy record -- CMD`.",
        )
    data = ViewData(store, model=model, metrics_dir=metrics, report=export is not None)
    if export is not None:
        assert out is not None
        _export(data, export, out)
        return
    _serve(data, host, port, open_browser)


def _export(data: ViewData, episode: str, out: Path) -> None:
    from polarproxy.view.data import NotFound
    from polarproxy.view.report import write_report

    try:
        stats = write_report(data, episode, out)
    except NotFound as e:
        fail(e.message, "List episodes with `polarproxy ls`.")
    except OSError as e:
        fail(f"Cannot write '{out}': {e.strerror or e}.", "Pass --out a path in a writable folder.")
    left = stats.calls - stats.calls_inlined
    typer.echo(
        f"Wrote {stats.path} ({stats.bytes / 1e6:.1f} MB): episode {stats.episode_id}, {stats.calls} calls, "
        f"{stats.trajectories} trajectories" + (f"; {left} calls' tokens left out (size)" if left else ""),
        err=True,
    )


def _serve(data: ViewData, host: str, port: int, open_browser: bool) -> None:
    import threading

    from polarproxy.view.server import bind, run, url_of

    try:
        sock = bind(host, port)
    except OSError as e:
        fail(
            f"Cannot listen on {host}:{port}: {e.strerror or e}.", "Pass another --port (0 picks a free one)."
        )
    url = url_of(sock)
    typer.echo(f"polarproxy view: serving {url} (read-only; Ctrl-C stops)", err=True)
    threading.Thread(target=data.warm, daemon=True, name="view-warm").start()
    if open_browser:
        _open(url)
    run(data, sock)


def _open(url: str) -> None:
    import webbrowser

    try:
        opened = webbrowser.get().open(url)
    except webbrowser.Error:
        opened = False
    if not opened:
        typer.echo(f"polarproxy view: no browser found here; open {url} yourself.", err=True)
