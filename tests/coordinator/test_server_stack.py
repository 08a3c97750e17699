"""The front door's server stack: uvloop and httptools where installed (`auto`), either one asked for
by name, asyncio and h11 on request; the access-log flags into the settings."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util

import pytest

from mindmotor.common.event_loop import loop_name, run
from mindmotor.common.http_limits import resolve_protocol
from mindmotor.coordinator import cli

HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None
HAVE_HTTPTOOLS = importlib.util.find_spec("httptools") is not None


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


def test_auto_picks_uvloop_and_httptools_where_installed():
    assert loop_name("auto") == ("uvloop" if HAVE_UVLOOP else "asyncio")
    assert resolve_protocol("auto") == ("httptools" if HAVE_HTTPTOOLS else "h11")
    assert run(_loop_module(), "auto") == ("uvloop" if HAVE_UVLOOP else "asyncio")
    assert run(_loop_module(), "asyncio") == "asyncio"
    assert resolve_protocol("h11") == "h11"
    with pytest.raises(ValueError):
        loop_name("trio")


def settings(*flags: str):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli.settings_from_args(parser.parse_args(["--worker", "127.0.0.1:1", *flags]))


def test_flags_reach_the_settings():
    default = settings()
    assert (default.event_loop, default.http_protocol, default.access_log, default.access_log_sample) == \
        ("auto", "auto", False, 1.0)
    s = settings("--event-loop", "asyncio", "--http-protocol", "h11", "--access-log", "--access-log-sample", "0.01")
    assert (s.event_loop, s.http_protocol, s.access_log, s.access_log_sample) == ("asyncio", "h11", True, 0.01)
    with pytest.raises(ValueError):
        settings("--access-log-sample", "0")
