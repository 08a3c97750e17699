"""The ASGI layers every HTTP request passes, outermost first:

- `RequestIdMiddleware`: a request id (the client's `X-Request-Id` if it is sane, else a new one)
  in the log context, in `scope["state"]` and in the `X-Request-Id` response header; one access
  log line (INFO for the API, DEBUG for a probe or scrape that succeeds) and the requests counter
  per request (by route template, `unmatched` for a path no route serves). The instances and
  versions that served a generation request (`respond.py` puts them in the state) go into the
  `X-MindMotor-Instance` and `X-MindMotor-Version` headers and the log line; the fields a request
  body had that this server ignored (`ignored.py`) into `X-MindMotor-Ignored-Fields`.
- `GateMiddleware`: the API key (401) and the per-key rate limit (429) of the API paths — before
  the body is read or parsed.
- `BodyLimitMiddleware`: bodies over the limit are refused with 413 before parsing, whether the
  size is announced (Content-Length) or not (chunked); the body is read here and handed on.
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mindmotor.common.logging import request_context

from mindmotor.coordinator.http.auth import APIKeys
from mindmotor.coordinator.http.errors import APIError, PayloadTooLarge, TooManyRequests
from mindmotor.coordinator.http.ignored import header_value
from mindmotor.coordinator.metrics import CoordinatorMetrics
from mindmotor.coordinator.http.rate_limit import RateLimiter

log = logging.getLogger("mindmotor.coordinator.access")

_SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
API_PREFIXES = ("/v1/", "/tokenize", "/detokenize", "/v2/models", "/invocations")   # /v2/models: KServe v2 / Triton
ADMIN_PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")   # as routes/lora.py's


async def send_error(send: Send, exc: APIError) -> None:
    body = exc.body_bytes()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp, metrics: CoordinatorMetrics, in_flight=None):
        self.app = app
        self.metrics = metrics
        self.in_flight = in_flight          # state.InFlight: open API requests, counted here

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        incoming = _header(scope, b"x-request-id")
        rid = incoming if incoming and _SANE_ID.match(incoming) else uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = rid
        status = 0
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                served = [(b"x-mindmotor-instance", state.get("instances")), (b"x-mindmotor-version", state.get("versions")),
                          (b"x-mindmotor-ignored-fields", header_value(state.get("ignored_fields") or []))]
                message = {**message, "headers": [*message.get("headers", ()), (b"x-request-id", rid.encode()),
                                                  *((k, v.encode()) for k, v in served if v)]}
            await send(message)

        counted = self.in_flight is not None and scope.get("path", "").startswith(API_PREFIXES)
        if counted:
            self.in_flight.requests += 1
        with request_context(rid):
            try:
                await self.app(scope, receive, send_with_id)
            finally:
                if counted:
                    self.in_flight.requests -= 1
                path = scope.get("path", "")
                api = path.startswith(API_PREFIXES)
                if api:       # labelled by the route's template: a client's paths cannot mint series
                    route = getattr(scope.get("route"), "path", None) or "unmatched"
                    self.metrics.requests.labels(route, state.get("model", ""), str(status or 499)).inc()
                # probes and scrapes (/health, /metrics) every few seconds are not news: DEBUG unless they fail
                level = logging.INFO if api or not 200 <= status < 400 else logging.DEBUG
                log.log(level, "request", extra={"method": scope.get("method"), "path": path, "status": status,
                                           "duration_s": round(time.perf_counter() - started, 6),
                                           "model": state.get("model"), "instance": state.get("instances") or None,
                                           "version": state.get("versions") or None})


class GateMiddleware:
    def __init__(self, app: ASGIApp, keys: APIKeys, limiter: RateLimiter | None, metrics: CoordinatorMetrics):
        self.app = app
        self.keys = keys
        self.limiter = limiter
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith(API_PREFIXES) \
                or scope.get("path") in ADMIN_PATHS:      # the admin token is their credential (routes/lora.py)
            return await self.app(scope, receive, send)
        try:
            identity = await self._check(scope)
        except APIError as exc:
            return await send_error(send, exc)
        scope.setdefault("state", {})["caller"] = identity
        await self.app(scope, receive, send)

    async def _check(self, scope: Scope) -> str:
        if self.keys.enabled:
            try:
                identity = self.keys.check(_header(scope, b"authorization"))
            except APIError:
                self.metrics.rejected.labels("unauthorized").inc()
                raise
        else:
            client = scope.get("client")
            identity = f"ip:{client[0]}" if client else "anonymous"
        if self.limiter is not None:
            decision = await self.limiter.acquire(identity)
            if not decision.allowed:
                self.metrics.rejected.labels("rate_limited").inc()
                raise TooManyRequests("rate limit exceeded for this API key; retry later",
                                      retry_after_s=decision.retry_after_s, code="rate_limit_exceeded")
        return identity


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"the request body exceeds the limit of {self.max_bytes} bytes",
                               code="body_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        length = _header(scope, b"content-length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_bytes:
            return await send_error(send, self._too_large())
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                return await send_error(send, self._too_large())
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)
