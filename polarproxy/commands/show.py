"""`polarproxy show EPISODE`: an episode's calls."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from polarproxy.commands.support import (
    DbOpt,
    EpisodeArg,
    JsonOpt,
    ModelOpt,
    NothingRecorded,
    fail,
    open_store,
    print_json,
)


def show(
    episode: EpisodeArg,
    db: DbOpt = None,
    tokens: Annotated[
        bool,
        typer.Option("--tokens", help="Show tokens, coloured by loss mask (sampled ones in ⟦ ⟧ when piped)."),
    ] = False,
    call: Annotated[int | None, typer.Option("--call", help="Only call N (the #N that show prints).")] = None,
    full: Annotated[
        bool,
        typer.Option(
            "--full",
            help="The agent's whole diff, and with --tokens every prompt token, not only each call's new ones.",
        ),
    ] = False,
    model: ModelOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Show an episode's calls: messages, token counts, finish reasons, errors."""
    from polarproxy.store.errors import StoreError
    from polarproxy.views import call_rows, render_episode, reward_rows

    try:
        store = open_store(db, create=False)
    except NothingRecorded:
        fail(
            f"No episode {episode!r}: no episode has been recorded yet.",
            "Record one with `polarproxy record -- CMD`.",
        )
    try:
        ep = store.get_episode(episode)
    except StoreError as e:
        fail(str(e), "List episodes with `polarproxy ls`.")
    calls = store.list_calls(ep.id)
    rewards = store.list_rewards(ep.id)
    if call is not None and all(c.seq != call for c in calls):
        fail(
            f"Episode {ep.id} has no call #{call}.",
            f"Its calls are #0 to #{len(calls) - 1}." if calls else "It has no calls.",
        )
    if json_out:
        calls = [c for c in calls if call is None or c.seq == call]
        from dataclasses import asdict

        print_json(
            {
                "episode": asdict(ep),
                "calls": call_rows(calls, with_tokens=tokens),
                "rewards": reward_rows(rewards),
            }
        )
        return
    decode = None
    if tokens:
        folder = model or (Path(ep.metadata["model_dir"]) if ep.metadata.get("model_dir") else None)
        if folder is not None and folder.is_dir():
            from polarproxy.render.renderer import Renderer

            decode = Renderer(folder).token_text
    import sys

    from rich.console import Console

    render_episode(
        Console(emoji=False),
        ep,
        calls,
        show_tokens=tokens,
        decode=decode,
        only_call=call,
        full_prompts=full,
        marks=not sys.stdout.isatty(),
        rewards=rewards,
    )
