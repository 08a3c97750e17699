"""common.rpc's interceptor on a real gRPC server: every kind of call (unary or streaming either
way, generator or context.write handlers) without the admin token, or without the cluster token,
is refused UNAUTHENTICATED; with it, served."""

from __future__ import annotations

import grpc
import pytest

from secrets_registry import given_secret
from mindmotor.common import rpc
from mindmotor.common.admin_token import bearer_metadata

pytestmark = pytest.mark.asyncio
TOKEN = given_secret("s3cret-interceptor")


async def echo(request, context):
    return request


async def echo_stream(request, context):
    yield request
    yield request


async def echo_in(requests, context):
    return b"".join([r async for r in requests])


async def echo_both(requests, context):
    async for r in requests:
        yield r


async def echo_written(request, context):        # a streaming handler that writes (the worker's Generate)
    await context.write(request)
    await context.write(request)


HANDLERS = {"Unary": grpc.unary_unary_rpc_method_handler(echo),
            "ServerStream": grpc.unary_stream_rpc_method_handler(echo_stream),
            "ClientStream": grpc.stream_unary_rpc_method_handler(echo_in),
            "BothStreams": grpc.stream_stream_rpc_method_handler(echo_both),
            "Written": grpc.unary_stream_rpc_method_handler(echo_written)}


async def calls(channel: grpc.aio.Channel, metadata, messages=(b"a", b"b")) -> list:
    """Each kind of call once (`messages` as the request stream); its result (bytes or list of
    bytes) or its status code."""
    async def one(call):
        try:
            result = call()
            return [m async for m in result] if hasattr(result, "__aiter__") else await result
        except grpc.aio.AioRpcError as exc:
            return exc.code()

    async def two():
        for m in messages:
            yield m

    return [await one(lambda: channel.unary_unary("/t.Echo/Unary")(b"x", metadata=metadata)),
            await one(lambda: channel.unary_stream("/t.Echo/ServerStream")(b"x", metadata=metadata)),
            await one(lambda: channel.stream_unary("/t.Echo/ClientStream")(two(), metadata=metadata)),
            await one(lambda: channel.stream_stream("/t.Echo/BothStreams")(two(), metadata=metadata)),
            await one(lambda: channel.unary_stream("/t.Echo/Written")(b"x", metadata=metadata))]


ADMIN_ONLY = rpc.Policy("t.Echo", default=frozenset({"admin"}))
SERVED = [b"x", [b"x", b"x"], b"ab", [b"a", b"b"], [b"x", b"x"]]
# refused calls get an empty request stream: a grpcio client still writing after the server ended
# the call reports INTERNAL now and then, interceptor or not
REFUSED = [grpc.StatusCode.UNAUTHENTICATED] * 5


async def serve(sec: rpc.RpcSecurity, **kwargs):
    server, port = rpc.make_server("127.0.0.1", 0, ADMIN_ONLY, sec=sec, **kwargs)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Echo", HANDLERS),))
    await server.start()
    return server, port


async def test_every_kind_of_call_needs_the_admin_token():
    server, port = await serve(rpc.RpcSecurity(), admin_token=TOKEN)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert await calls(channel, (), messages=()) == REFUSED
            assert await calls(channel, bearer_metadata("wrong"), messages=()) == REFUSED
            assert await calls(channel, bearer_metadata(TOKEN)) == SERVED
    finally:
        await server.stop(None)


async def test_every_kind_of_call_needs_the_cluster_token():
    server, port = await serve(rpc.RpcSecurity(token="cluster-secret"))
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert await calls(channel, (), messages=()) == REFUSED
            assert await calls(channel, ((rpc.TOKEN_HEADER, "guess"),), messages=()) == REFUSED
        async with rpc.aio_channel(f"127.0.0.1:{port}", sec=rpc.RpcSecurity(token="cluster-secret")) as channel:
            assert await calls(channel, ()) == SERVED          # the channel adds the token to every call
    finally:
        await server.stop(None)


async def test_open_beyond_loopback_refuses_to_start():
    with pytest.raises(rpc.RpcSettingsError, match="without credentials"):
        rpc.make_server("0.0.0.0", 0, ADMIN_ONLY, sec=rpc.RpcSecurity())
    with pytest.raises(rpc.RpcSettingsError, match="without credentials"):        # members may call a worker
        rpc.make_server("0.0.0.0", 0, rpc.WORKER_POLICY, sec=rpc.RpcSecurity(), admin_token=TOKEN)
    # an admin token guarding every method (the Deployer's API) is a credential
    server, _ = rpc.make_server("0.0.0.0", 0, rpc.DEPLOYER_POLICY, sec=rpc.RpcSecurity(), admin_token=TOKEN)
    await server.stop(None)
