"""What a failed worker call means, for the request and for the instance.

Every gRPC status a worker call can end with falls in one class (`classify`):

- **the request is bad** (INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE): a 400 with the
  worker's message; never retried, never held against the instance.
- **busy** (RESOURCE_EXHAUSTED: the worker is at its limit of concurrent calls; CANCELLED sent by
  the worker: gRPC's own load shedding of calls it could not pick up): another instance is tried;
  the instance is not marked failed. When every instance is busy: 429 with Retry-After.
- **the instance failed** (UNAVAILABLE and the like: the worker died, is unreachable or draining;
  a worker whose engine died says so): the instance is marked failed (skipped for a while,
  reported) and the request moves to another one, continuing after the tokens it already has.
- **the request failed there** (INTERNAL, UNKNOWN, DATA_LOSS, ALREADY_EXISTS: the worker is fine
  but could not serve this request — the engine raised for it): another instance is tried,
  without marking this one. A request that failed like this (or killed an engine) on two
  instances is not sent to a third: it is likely what fails (`MAX_REQUEST_FAILURES`).
- **ours** (a CANCELLED or DEADLINE_EXCEEDED the coordinator caused: the client went away, an
  n > 1 fan-out was stopped, a timeout of its own ran out): not a worker failure at all.

Workers say which of their INTERNAL/UNAVAILABLE answers concern the request and which the
engine in the trailing metadata `mindmotor-failure` (`protocol/failure.py`).
"""

from __future__ import annotations

import grpc

from mindmotor.vocabulary import FailureKind

from mindmotor.protocol.failure import ENGINE_DEAD, FAILURE_METADATA_KEY, PARAM_METADATA_KEY, REQUEST_FAILED

from mindmotor.coordinator.http.errors import BadRequest, InternalError

MAX_REQUEST_FAILURES = 2                      # instances a request may fail on before it is given up


REQUEST_ERRORS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                            grpc.StatusCode.OUT_OF_RANGE})
FAILED_THERE = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS,
                          grpc.StatusCode.ALREADY_EXISTS})
INSTANCE_FAILURES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED})


class RefusedByInstance(BadRequest):
    """A 400 the instance answered for a request this coordinator's own rules (the same ones,
    engine/request_rules.py) accepted: the client gets a 400, but the refusal is the serving
    version's doing (e.g. token ids outside a canary's own vocabulary), so canary analysis counts it
    (coordinator/dispatch/respond.py: `version_fault`)."""


class WorkerFailure(Exception):
    """The attempt on one instance failed; another one may serve the request.

    `kind`: BUSY (try another, mark nothing), INSTANCE (mark the instance failed), REQUEST (the
    request failed there; counts towards MAX_REQUEST_FAILURES). `engine_died`: the instance's
    engine died during the request (marked failed, and counted as a request failure too)."""

    def __init__(self, reason: str, kind: FailureKind = FailureKind.INSTANCE, engine_died: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        self.engine_died = engine_died

    @property
    def marks_instance(self) -> bool:
        return self.kind == FailureKind.INSTANCE

    @property
    def counts_against_request(self) -> bool:
        return self.kind == FailureKind.REQUEST or self.engine_died


class OwnCancellation(Exception):
    """A call the coordinator itself cancelled or timed out: no one's failure."""


def worker_says(exc: grpc.aio.AioRpcError, key: str = FAILURE_METADATA_KEY) -> str:
    """A trailing metadata value of the worker's answer ("" when absent)."""
    try:
        for k, value in exc.trailing_metadata() or ():
            if k == key:
                return value if isinstance(value, str) else value.decode()
    except Exception:  # noqa: BLE001 - metadata is a hint only
        pass
    return ""


def is_own_cancellation(exc: grpc.aio.AioRpcError) -> bool:
    """A status this coordinator caused: a cancel of its own ("Locally cancelled by application!")
    or its own deadline (workers set none)."""
    code = exc.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return True
    return code == grpc.StatusCode.CANCELLED and "locally cancelled" in (exc.details() or "").lower()


def classify(exc: grpc.aio.AioRpcError) -> Exception:
    """The exception to raise for a failed call: BadRequest (4xx), WorkerFailure (of a kind),
    OwnCancellation, or InternalError (a status no retry can help, e.g. UNIMPLEMENTED)."""
    code = exc.code()
    details = exc.details() or ""
    reason = f"{code.name}: {details}"
    if code in REQUEST_ERRORS:
        return RefusedByInstance(details or "the worker refused the request",
                          param=worker_says(exc, PARAM_METADATA_KEY) or None, code="invalid_value")
    if is_own_cancellation(exc):
        return OwnCancellation(reason)
    if code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.CANCELLED):
        return WorkerFailure(reason, FailureKind.BUSY)
    said = worker_says(exc)
    if said == ENGINE_DEAD:
        return WorkerFailure(reason, FailureKind.INSTANCE, engine_died=True)
    if code in FAILED_THERE or said == REQUEST_FAILED:
        return WorkerFailure(reason, FailureKind.REQUEST)
    if code in INSTANCE_FAILURES:
        return WorkerFailure(reason, FailureKind.INSTANCE)
    return InternalError(f"the worker failed the request ({reason})")

