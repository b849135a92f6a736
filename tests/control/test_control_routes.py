"""`serve`'s routing cache (control/routes.py `Routes`): what it trusts, for how long, and what it forgets."""

from __future__ import annotations

import pytest

from polarproxy.control import routes as control
from polarproxy.control.routes import Routes


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(control.time, "monotonic", lambda: now[0])
    return now


def test_a_confirmed_episode_and_key_route_until_the_ttl_passes(clock):
    routes = Routes(ttl_s=2.0)
    assert not routes.named("ep1") and routes.keyed("pp-k1") is None
    routes.confirm("ep1", "pp-k1")
    assert routes.keyed("pp-k1") == "ep1" and routes.keyed("pp-other") is None
    assert not routes.named("ep1")  # a key's lookup did not check the owner a named call needs
    routes.confirm("ep1")
    assert routes.named("ep1")
    clock[0] += 2.5  # a finish through another proxy on the same database is seen within the TTL
    assert not routes.named("ep1") and routes.keyed("pp-k1") is None


def test_an_episode_finished_here_stops_routing_at_once_and_a_racing_read_cannot_bring_it_back(clock):
    routes = Routes()
    routes.confirm("ep1", "pp-k1")
    routes.confirm("ep1")
    routes.drop("ep1")
    assert not routes.named("ep1") and routes.keyed("pp-k1") is None
    routes.confirm("ep1", "pp-k1")  # reads that began before the finish was stored
    routes.confirm("ep1")
    assert not routes.named("ep1") and routes.keyed("pp-k1") is None


def test_the_tables_are_bounded(clock, monkeypatch):
    monkeypatch.setattr(control, "MAX_ROUTES", 3)
    routes = Routes()
    for i in range(5):
        routes.confirm(f"ep{i}", f"pp-k{i}")
        routes.confirm(f"ep{i}")
        routes.drop(f"gone{i}")
    assert not routes.named("ep0") and routes.keyed("pp-k1") is None
    assert routes.named("ep4") and routes.keyed("pp-k4") == "ep4"
    assert max(len(routes._named), len(routes._keys), len(routes._ended)) == 3


def test_keys_are_held_as_hashes_only():
    routes = Routes()
    routes.confirm("ep1", "pp-secret-key")
    assert "pp-secret-key" not in repr(routes._keys)
