"""The addon's `polarproxy_prefix_policy` option reaches the gateway's T2 index, and a bad value is refused
with the allowed ones named (taddons: no sockets)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from mitmproxy import exceptions
from mitmproxy.test import taddons

from polarproxy.capture.addon import Recorder


def configure(tctx, addon, model, tmp_path, **extra):
    tctx.configure(
        addon,
        mode=["reverse:http://127.0.0.1:9"],
        polarproxy_model=str(model),
        polarproxy_db=str(tmp_path / "a.db"),
        **extra,
    )


@pytest.mark.parametrize("policy", ["extend", "fresh"])
def test_the_prefix_policy_option_sets_the_gateway_policy(random_model_dir, tmp_path, policy):
    addon = Recorder()
    with taddons.context(addon) as tctx:
        configure(tctx, addon, random_model_dir, tmp_path, polarproxy_prefix_policy=policy)
        assert asyncio.run(_policy(addon)) == policy


async def _policy(addon):
    """The policy of the gateway mitmdump builds once it runs (capture/stack.py), without a backend to detect."""
    await addon._start_stack(dataclasses.replace(addon._config, check_backend=False, backend_kind="sglang"))
    try:
        return addon.gateway.prefixes.policy
    finally:
        await addon.done()


def test_an_unknown_prefix_policy_is_refused_with_the_allowed_values(random_model_dir, tmp_path):
    addon = Recorder()
    with taddons.context(addon) as tctx:
        configure(tctx, addon, random_model_dir, tmp_path)
        with pytest.raises(
            exceptions.OptionsError, match=r"Unknown prefix policy 'sometimes'.*'extend', 'fresh'"
        ):
            tctx.configure(addon, polarproxy_prefix_policy="sometimes")
