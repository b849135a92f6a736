"""Who may generate while the weights change: a readers-writer gate with SGLang's pause modes.

Generations are readers, a weight swap is the writer, as in SGLang's TokenizerManager
(`model_update_lock` plus `is_pause`):

- A swap waits for the generations in flight to finish, and new generations wait while a swap is
  pending or running, so every token of a call comes from one weight version.
- `pause("abort")` (SGLang's default mode) stops admitting generations and aborts the ones in flight;
  it returns once none is left. `pause("in_place")` and `pause("retract")` stop admitting and freeze the
  ones in flight at their next token until `resume()`. While paused, a swap does not wait (SGLang
  updates a paused engine at once), so a frozen generation continues on the new weights: its chunks
  then report two versions.
- `resume()` (SGLang's `/continue_generation`) admits and unfreezes again.

Pure threading; no torch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from polarproxy.choices import PAUSE_MODES, PauseMode

_POLL_S = 0.05


class GateClosed(Exception):
    """The caller gave up (its client went away) while waiting to be admitted."""


@dataclass
class Ticket:
    """An admitted generation; `epoch` tells whether an abort came after it was admitted."""

    epoch: int


class WeightGate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0  # admitted generations not yet finished
        self._swaps = 0  # swaps waiting for the generations in flight, or running
        self._paused = False
        self._mode: PauseMode = "abort"
        self._abort_epoch = 0

    # -- generations -----------------------------------------------------------------------------

    @contextmanager
    def generation(self, gone: Callable[[], bool] = lambda: False) -> Iterator[Ticket]:
        """Admit one generation (waiting while paused or while a swap is pending); raises GateClosed when
        `gone()` turns true while it waits."""
        with self._cond:
            while self._paused or self._swaps:
                if gone():
                    raise GateClosed
                self._cond.wait(_POLL_S)
            self._active += 1
            ticket = Ticket(self._abort_epoch)
        try:
            yield ticket
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def aborted(self, ticket: Ticket) -> bool:
        """Whether `pause("abort")` was called after `ticket` was admitted."""
        return ticket.epoch != self._abort_epoch

    def wait_while_frozen(self, ticket: Ticket, gone: Callable[[], bool]) -> None:
        """Block a running generation while the gate is paused in place (or retract), until resumed,
        aborted, or `gone()`."""
        with self._cond:
            while self._paused and self._mode != "abort" and not self.aborted(ticket):
                if gone():
                    return
                self._cond.wait(_POLL_S)

    # -- pause -----------------------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def in_flight(self) -> int:
        """Admitted generations that have not finished (running, frozen, or queued for the model)."""
        return self._active

    @property
    def pending_swaps(self) -> int:
        """Swaps waiting for the generations in flight, or running."""
        return self._swaps

    def pause(self, mode: PauseMode = "abort") -> None:
        if mode not in PAUSE_MODES:
            allowed = ", ".join(repr(m) for m in PAUSE_MODES)
            raise ValueError(f"Invalid mode: {mode!r}. Expected one of [{allowed}].")
        with self._cond:
            self._paused = True
            self._mode = mode
            if mode == "abort":
                self._abort_epoch += 1
                self._cond.notify_all()
                while self._active:
                    self._cond.wait(_POLL_S)

    def abort_all(self) -> None:
        """Abort the generations in flight without pausing (SGLang's `abort_all_requests`)."""
        with self._cond:
            self._abort_epoch += 1
            self._cond.notify_all()

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    # -- swaps -----------------------------------------------------------------------------------

    @contextmanager
    def swap(self) -> Iterator[bool]:
        """Hold off new generations and wait for those in flight, then run the body (the swap). Yields
        whether it drained them: False when the gate is paused, which swaps at once (as SGLang does)."""
        with self._cond:
            if self._paused:
                drained = False
            else:
                drained = True
                self._swaps += 1
                while self._active:
                    self._cond.wait(_POLL_S)
        try:
            yield drained
        finally:
            if drained:
                with self._cond:
                    self._swaps -= 1
                    self._cond.notify_all()
