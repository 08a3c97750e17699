"""The admin-token interceptor on a real gRPC server: every kind of call (unary or streaming either
way) without the token is refused UNAUTHENTICATED; with it, served."""

from __future__ import annotations

import grpc
import pytest

from mindmotor.common.admin_token import AdminTokenInterceptor, bearer_metadata

pytestmark = pytest.mark.asyncio
TOKEN = "s3cret"


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


HANDLERS = {"Unary": grpc.unary_unary_rpc_method_handler(echo),
            "ServerStream": grpc.unary_stream_rpc_method_handler(echo_stream),
            "ClientStream": grpc.stream_unary_rpc_method_handler(echo_in),
            "BothStreams": grpc.stream_stream_rpc_method_handler(echo_both)}


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
            await one(lambda: channel.stream_stream("/t.Echo/BothStreams")(two(), metadata=metadata))]


async def test_every_kind_of_call_needs_the_token():
    server = grpc.aio.server(interceptors=[AdminTokenInterceptor(TOKEN)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.Echo", HANDLERS),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            # refused calls get an empty request stream: a grpcio client still writing after the
            # server ended the call reports INTERNAL now and then, interceptor or not
            refused = [grpc.StatusCode.UNAUTHENTICATED] * 4
            assert await calls(channel, (), messages=()) == refused
            assert await calls(channel, bearer_metadata("wrong"), messages=()) == refused
            assert await calls(channel, bearer_metadata(TOKEN)) == [b"x", [b"x", b"x"], b"ab", [b"a", b"b"]]
    finally:
        await server.stop(None)
