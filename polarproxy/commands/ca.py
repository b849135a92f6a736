"""`polarproxy ca path|install-hint`: the CA that intercept mode signs provider certificates with."""

from __future__ import annotations

import typer

from polarproxy.commands.support import fail

ca_app = typer.Typer(
    no_args_is_help=True, help="The CA that intercept mode signs provider certificates with."
)


@ca_app.command("path")
def ca_path() -> None:
    """Print the CA certificate's path (created on first use)."""
    from polarproxy.errors import PolarproxyError
    from polarproxy.harness.intercept.command import ca_path as get_path

    try:
        typer.echo(get_path())
    except PolarproxyError as e:
        fail(e.message, e.hint)


@ca_app.command("install-hint")
def ca_install_hint() -> None:
    """Show how to make other programs or machines trust the CA."""
    from polarproxy.errors import PolarproxyError
    from polarproxy.harness.intercept.command import ca_install_hint as hint

    try:
        typer.echo(hint())
    except PolarproxyError as e:
        fail(e.message, e.hint)
