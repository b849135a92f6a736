"""`polarproxy reward EPISODE VALUE [--call N]`: set an episode's reward, or one call's, after the fact."""

from __future__ import annotations

import math
from typing import Annotated

import typer

from polarproxy.commands.support import DbOpt, EpisodeArg, JsonOpt, fail, open_store, print_json, usage_fail

# Registered with context_settings={"ignore_unknown_options": True}, so that a negative VALUE (-1.0) is a
# value, not an unknown option.
CONTEXT_SETTINGS = {"ignore_unknown_options": True}


def reward(
    episode: EpisodeArg,
    value: Annotated[str, typer.Argument(help="The reward, a number (e.g. 1.0, 0.25, -1).")],
    call: Annotated[
        int | None,
        typer.Option(
            "--call",
            help="Set this call's reward (its number, as `polarproxy show` prints it: 0 is the first); it "
            "overrides the episode's for that call.",
        ),
    ] = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Set the reward of an episode (or of one of its calls); where it came from is recorded."""
    from polarproxy.store.errors import StoreError
    from polarproxy.store.records import RewardOrigin

    try:
        number = float(value)
    except ValueError:
        usage_fail(f"Reward {value!r} is not a number.", "Give a number such as 1.0, 0.25 or -1.")
    if not math.isfinite(number):
        usage_fail(f"Reward {value!r} is not a finite number.", "Give a number such as 1.0, 0.25 or -1.")
    if call is not None and call < 0:
        usage_fail(
            f"--call {call} is negative.", "0 is the first call; `polarproxy show EPISODE` numbers them."
        )
    store = open_store(db, create=False)
    try:
        ep = store.get_episode(episode)
        store.set_reward(ep.id, number, call=call, origin=RewardOrigin(source="cli"))
    except StoreError as e:
        fail(str(e), "List episodes with `polarproxy ls`, and their calls with `polarproxy show EPISODE`.")
    finally:
        store.close()
    if json_out:
        print_json({"episode_id": ep.id, "call": call, "reward": number, "source": "cli"})
    else:
        where = f"call #{call} of episode {ep.id}" if call is not None else f"episode {ep.id}"
        typer.echo(f"reward {number:g} set for {where}", err=True)
