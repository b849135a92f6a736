"""Fixtures of the rollout tests (helpers are in rollout_support.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rollout_support import Stub


@pytest.fixture
def make_stub_backend(tiny_model_dir: Path):
    """make_stub_backend(**StubConfig fields): a backend that answers every call with "Hello there."
    (its tokens, stop token included)."""
    from polarproxy.backends.stub import StubConfig
    from polarproxy.render.renderer import Renderer

    renderer = Renderer(tiny_model_dir)
    ids = [*renderer.encode("Hello there."), renderer.stop_token_ids[0]]
    stubs: list[Stub] = []

    def make(**kw) -> Stub:
        stubs.append(Stub(StubConfig(output_ids=ids, **kw)))
        return stubs[-1]

    yield make
    for s in stubs:
        s.stop()


@pytest.fixture
def stub_backend(make_stub_backend):
    return make_stub_backend()
