"""heap.settle: what is alive is moved out of the cyclic collector's passes, unless turned off."""

from __future__ import annotations

import gc

import pytest

from polarproxy import heap


@pytest.fixture(autouse=True)
def _unfrozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_settle_freezes_what_is_alive() -> None:
    kept = [[i] for i in range(1000)]  # tracked containers
    heap.settle()
    assert gc.get_freeze_count() >= len(kept)
    # frozen objects are still freed by their reference counts
    del kept


def test_settle_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLARPROXY_GC_FREEZE", "0")
    heap.settle()
    assert gc.get_freeze_count() == 0
