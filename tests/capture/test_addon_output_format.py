"""The addon's polarproxy_tool_format / polarproxy_reasoning_format options: declared, validated, applied."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from mitmproxy import exceptions
from mitmproxy.test import taddons

from polarproxy.capture.addon import Recorder


def configure(tiny_model_dir, tmp_path, **options):
    addon = Recorder()
    with taddons.context(addon) as tctx:
        tctx.configure(
            addon,
            mode=["reverse:http://127.0.0.1:9"],
            polarproxy_model=str(tiny_model_dir),
            polarproxy_db=str(tmp_path / "a.db"),
            **options,
        )
        return asyncio.run(_output_format(addon))


async def _output_format(addon):
    """The format of the gateway mitmdump builds once it runs (capture/stack.py), without a backend to detect."""
    await addon._start_stack(dataclasses.replace(addon._config, check_backend=False, backend_kind="sglang"))
    try:
        return addon.gateway.output_format
    finally:
        await addon.done()


def test_the_format_is_detected_from_the_model_when_no_option_is_set(tiny_model_dir, tmp_path):
    fmt = configure(tiny_model_dir, tmp_path)
    assert (fmt.tool, fmt.reasoning) == ("hermes", "think")


def test_the_options_override_the_detected_format(tiny_model_dir, tmp_path):
    fmt = configure(
        tiny_model_dir, tmp_path, polarproxy_tool_format="qwen-xml", polarproxy_reasoning_format="none"
    )
    assert (fmt.tool, fmt.reasoning) == ("qwen-xml", "none")


@pytest.mark.parametrize(
    ("option", "value", "allowed"),
    [("polarproxy_tool_format", "xml", "'qwen-xml'"), ("polarproxy_reasoning_format", "r1", "'think'")],
)
def test_an_unknown_format_is_refused_naming_the_allowed_ones(
    tiny_model_dir, tmp_path, option, value, allowed
):
    addon = Recorder()
    with taddons.context(addon) as tctx:
        tctx.configure(
            addon,
            mode=["reverse:http://127.0.0.1:9"],
            polarproxy_model=str(tiny_model_dir),
            polarproxy_db=str(tmp_path / "a.db"),
        )
        with pytest.raises(exceptions.OptionsError, match=allowed):
            tctx.configure(addon, **{option: value})
