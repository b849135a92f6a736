"""Pulling a gateway's trajectory stream (`serve`'s control API, through `polarproxy.client`): whole groups
with their advantages, one long poll at a time, with errors that say what is wrong and what to do. What
`train --follow` and `export --follow` read."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from polarproxy.redact import without_userinfo


class StreamError(RuntimeError):
    """The gateway cannot be followed (unreachable, refused, not a gateway); `hint` says what to do."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class TrajectoryPuller:
    """The trajectory stream of the gateway at `url`, from `cursor` on: each `pull` is one long poll of
    whole groups (`groups=complete`), with `advantages` computed at the gateway."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        strategy: str,
        advantages: str,
        std_estimator: str = "sample",
        cursor: str | None = None,
    ) -> None:
        from polarproxy.client import Client

        self.url, self.strategy, self.advantages, self.std_estimator = (
            url,
            strategy,
            advantages,
            std_estimator,
        )
        self.cursor = cursor
        self.client = Client(url, token)

    @property
    def shown(self) -> str:
        return without_userinfo(self.url)

    @property
    def excluded_failed(self) -> int:
        """Episodes the stream's answers left out of their groups as `infra` failures, so far."""
        return self.client.excluded_failed

    def pull(self, wait: float) -> list[dict[str, Any]]:
        """The export rows of the groups completed since the cursor (waiting up to `wait` seconds for one);
        the cursor moves past them. StreamError for a gateway that cannot be read."""
        import httpx

        from polarproxy.client import ControlError

        try:
            rows, self.cursor = self.client.pull(
                strategy=self.strategy,
                cursor=self.cursor,
                wait=wait,
                groups="complete",
                advantages=self.advantages,
                std_estimator=self.std_estimator,
            )
        except ControlError as e:
            if e.status in (401, 403):
                raise StreamError(
                    f"The gateway at {self.shown} refused the control token ({e.status}: {e.message}).",
                    "Pass the --control-token (or POLARPROXY_CONTROL_TOKEN) that `polarproxy serve` was started with.",
                ) from None
            raise StreamError(f"The gateway at {self.shown} answered {e.status}: {e.message}") from None
        except httpx.HTTPError as e:
            raise StreamError(
                f"Cannot reach the gateway at {self.shown} ({type(e).__name__}: {e}).",
                "Start it with `polarproxy serve --control-token TOKEN ...`, or pass the URL it printed.",
            ) from None
        except (ValueError, KeyError) as e:
            raise StreamError(
                f"{self.shown} did not answer as a polarproxy gateway's trajectory stream ({e}).",
                "Pass the URL of `polarproxy serve` (it printed it when it started).",
            ) from None
        return rows

    def close(self) -> None:
        self.client.close()


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event, on_signal: Callable[[int], None] | None = None) -> Iterator[None]:
    """Set `stop` on SIGINT or SIGTERM (instead of KeyboardInterrupt) while inside; `on_signal(signum)`
    is told. Only the main thread can install handlers; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: FrameType | None) -> None:
        stop.set()
        if on_signal is not None:
            on_signal(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
