"""What a failed worker call means for the request: resubmit elsewhere, or tell the client."""

from __future__ import annotations

import grpc

from .errors import BadRequest, InternalError

# The worker (or the way to it) failed: the request can go to another instance.
RETRYABLE = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED,
    grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.DATA_LOSS,
})


class WorkerFailure(Exception):
    """The instance failed this request; another one may serve it."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def classify(exc: grpc.aio.AioRpcError) -> Exception:
    """The exception to raise for a failed call: WorkerFailure (retry), BadRequest, InternalError."""
    code = exc.code()
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return BadRequest(exc.details() or "the worker refused the request", code="invalid_value")
    if code in RETRYABLE:
        return WorkerFailure(f"{code.name}: {exc.details()}")
    return InternalError(f"the worker failed the request ({code.name}: {exc.details()})")
