"""The keepalive policy of common.rpc agrees between clients and servers. A client that pings an
idle connection more often than its server allows collects ping strikes until the server sends
GOAWAY "too_many_pings" and drops the connection (issue 9: "UNAVAILABLE: Too many pings" on the
first request after an idle minute, the coordinator pinging every 10 s, the worker's server on
grpc's defaults). Reproduced here in seconds with the intervals scaled down by 10, next to the
platform's policy scaled the same way, under which the connection stays up."""

from __future__ import annotations

import asyncio
import time

import grpc

from mindmotor.common import rpc

SCALE = 10                      # the platform's 10 s client pings → 1 s (grpc's shortest)
IDLE_S = 4.5                    # the strict server hangs up after ~3 bad pings


async def echo(request, context):
    return request


async def connection_survives_idle(server_options) -> tuple[bool, bytes]:
    """(whether the channel stayed READY through IDLE_S without calls, a call's answer afterwards)."""
    server, port = rpc.make_server("127.0.0.1", 0, rpc.Policy("t.Echo", default=rpc.ANY),
                                   sec=rpc.RpcSecurity(), options=server_options)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "t.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}),))
    await server.start()
    client = rpc.client_options(keepalive_ms=rpc.CLIENT_KEEPALIVE_MS // SCALE, timeout_ms=1_000)
    try:
        async with rpc.aio_channel(f"127.0.0.1:{port}", options=client, sec=rpc.RpcSecurity()) as channel:
            call = channel.unary_unary("/t.Echo/Echo")
            assert await call(b"hello", timeout=5) == b"hello"
            stayed = True
            deadline = time.monotonic() + IDLE_S
            while (left := deadline - time.monotonic()) > 0:
                state = channel.get_state()
                if state != grpc.ChannelConnectivity.READY:
                    stayed = False
                    break
                try:
                    await asyncio.wait_for(channel.wait_for_state_change(state), left)
                except asyncio.TimeoutError:
                    break
            return stayed, await call(b"again", timeout=5)
    finally:
        await server.stop(None)


def test_only_the_agreed_policy_keeps_idle_connections_up():
    # before: the server kept grpc's defaults (no pings without calls, 5 min apart at most);
    # max_ping_strikes 1 (default 2) only makes it hang up one ping sooner
    strict = [("grpc.keepalive_permit_without_calls", 0), ("grpc.http2.min_ping_interval_without_data_ms", 300_000),
              ("grpc.keepalive_time_ms", 7_200_000), ("grpc.http2.max_ping_strikes", 1)]
    agreed = rpc.server_options(min_ping_ms=rpc.SERVER_MIN_PING_MS // SCALE,
                                keepalive_ms=rpc.SERVER_KEEPALIVE_MS // SCALE)

    async def both():
        return await asyncio.gather(connection_survives_idle(strict), connection_survives_idle(agreed))

    (strict_stayed, _), (agreed_stayed, answer) = asyncio.run(both())
    assert not strict_stayed, "a server counting client pings as strikes should have sent GOAWAY"
    assert agreed_stayed and answer == b"again"


def test_servers_accept_the_pings_clients_send():
    client, server = dict(rpc.client_options()), dict(rpc.server_options())
    assert server["grpc.keepalive_permit_without_calls"] == client["grpc.keepalive_permit_without_calls"] == 1
    assert server["grpc.http2.min_ping_interval_without_data_ms"] <= client["grpc.keepalive_time_ms"]
