"""The admin token on gRPC: metadata `authorization: Bearer <token>`, compared in constant time.

    ok = bearer_matches(context.invocation_metadata(), token)     # one admin RPC (the controller's)
    server = grpc.aio.server(interceptors=[AdminTokenInterceptor(token)])   # every RPC (the deployer)
    stub.Apply(request, metadata=bearer_metadata(token))          # the caller's side

The standard health service stays open, so probes (Kubernetes, load balancers) need no token.
"""

from __future__ import annotations

import hmac
from typing import Iterable

import grpc

HEALTH_SERVICE_PREFIX = "/grpc.health.v1.Health/"


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def bearer_matches(metadata: Iterable[tuple[str, str]] | None, token: str) -> bool:
    """Whether the call's metadata carries `authorization: Bearer <token>`."""
    header = next((value for key, value in (metadata or ()) if key.lower() == "authorization"), "")
    scheme, _, given = str(header).partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


class AdminTokenInterceptor(grpc.aio.ServerInterceptor):
    """UNAUTHENTICATED for every call (but health checks) without the admin token."""

    def __init__(self, token: str):
        self.token = token

    async def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method.startswith(HEALTH_SERVICE_PREFIX) or \
                bearer_matches(handler_call_details.invocation_metadata, self.token):
            return await continuation(handler_call_details)
        return _refuse_handler(await continuation(handler_call_details))


MESSAGE = "invalid or missing admin token (metadata authorization: Bearer <token>)"


def _refuse_handler(handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler | None:
    """A handler of the same kind (unary or streaming either way) that aborts UNAUTHENTICATED;
    a streaming response is refused by an async generator, as grpc.aio expects of such handlers."""
    if handler is None:
        return None

    async def refuse(request_or_iterator, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, MESSAGE)

    async def refuse_stream(request_or_iterator, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, MESSAGE)
        yield  # pragma: no cover - abort raises; the yield makes this an async generator

    kind = (handler.request_streaming, handler.response_streaming)
    make = {(False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler}[kind]
    return make(refuse_stream if handler.response_streaming else refuse,
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
