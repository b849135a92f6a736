"""Fixtures: a test CA and provider stand-ins on loopback (helpers to run polarproxy: intercept_run.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from standin import StandIn, TestCA


@pytest.fixture(scope="session")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA.make(tmp_path_factory.mktemp("test-ca"))


@pytest.fixture(scope="session")
def standin(test_ca: TestCA) -> Iterator[StandIn]:
    server = StandIn(test_ca)
    yield server
    server.stop()
