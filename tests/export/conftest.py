"""The recorded sample of tests/reconstruct/conftest.py, in a real store."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from polarproxy.store import Store

_spec = importlib.util.spec_from_file_location(
    "_polarproxy_reconstruct_sample", Path(__file__).resolve().parent.parent / "reconstruct" / "conftest.py"
)
_sample = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_sample)
record_sample = _sample.record_sample


@pytest.fixture
def recorded(tmp_path):
    store = Store.open(tmp_path / "pp.db")
    ids = record_sample(store)
    yield store, ids
    store.close()


@pytest.fixture
def sample_recorder():
    """record_sample itself, for tests that add more to the store it fills."""
    return record_sample
