"""`FrontDoor`: the one ASGI layer of the coordinator's own that every HTTP request passes (pure
ASGI: one call per request, no task or queue of its own; issue 26 measured three nested layers
at close to half the coordinator's busy time). In order:

- the request id: the client's `X-Request-Id` if it is sane, else a new one, in the log context,
  in `scope["state"]` and in the `X-Request-Id` response header;
- the gate of the API paths: the API key (401) and the per-key rate limit (429) — before the body
  is read or parsed (the LoRA admin paths carry their own credential: routes/lora.py);
- the body limit: a body over `max_body_bytes` is refused with 413 before parsing, whether its
  size is announced (Content-Length) or not (chunked); the body is read here and handed on;
- on the response: the instances and versions that served a generation request (`respond.py`
  puts them in the state) in the `X-MindMotor-Instance` and `X-MindMotor-Version` headers, the
  fields of the request body this server ignored (`ignored.py`) in `X-MindMotor-Ignored-Fields`;
- when it ends: the requests counter (API paths, by route template, `unmatched` for a path no route
  serves: a client's paths cannot mint series) and the log line `request` (logger
  `mindmotor.coordinator.access`): at DEBUG for every request, at INFO for a sample of them
  (`access_log`, `access_log_sample`: every 1/sample-th request) and always for a 5xx or a
  probe/scrape (a non-API path) that fails.

Errors refused here are the API's error JSON (`errors.APIError`), counted and logged as any
other response.
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mindmotor.common.logging import request_id_var

from mindmotor.coordinator.http.auth import APIKeys
from mindmotor.coordinator.http.errors import APIError, PayloadTooLarge, TooManyRequests
from mindmotor.coordinator.http.ignored import header_value
from mindmotor.coordinator.metrics import CoordinatorMetrics
from mindmotor.coordinator.http.rate_limit import RateLimiter

log = logging.getLogger("mindmotor.coordinator.access")

_SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
API_PREFIXES = ("/v1/", "/tokenize", "/detokenize", "/v2/models", "/invocations")   # /v2/models: KServe v2 / Triton
ADMIN_PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")   # as routes/lora.py's
_BODYLESS = frozenset(("GET", "HEAD", "OPTIONS"))
_MAX_CACHED_LABELS = 4096


async def send_error(send: Send, exc: APIError) -> None:
    body = exc.body_bytes()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class FrontDoor:
    def __init__(self, app: ASGIApp, metrics: CoordinatorMetrics, keys: APIKeys, limiter: RateLimiter | None,
                 max_body_bytes: int, in_flight=None, access_log: bool = False, access_log_sample: float = 1.0):
        self.app = app
        self.metrics = metrics
        self.keys = keys
        self.limiter = limiter
        self.max_body_bytes = max_body_bytes
        self.in_flight = in_flight          # state.InFlight: open API requests, counted here
        self.access_sample = max(0.0, min(1.0, access_log_sample)) if access_log else 0.0
        self._sampled = 1.0 - self.access_sample if self.access_sample else 0.0   # the first one is logged
        self._counters: dict[tuple[str, str, int], object] = {}     # (route, model, status) -> its child

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        incoming = authorization = length = None
        for key, value in scope["headers"]:          # one pass for the three headers read here
            if key == b"x-request-id":
                incoming = value
            elif key == b"authorization":
                authorization = value
            elif key == b"content-length":
                length = value
        rid = None
        if incoming is not None:
            incoming = incoming.decode("latin-1")
            if _SANE_ID.match(incoming):
                rid = incoming
        if rid is None:
            rid = uuid.uuid4().hex
        state = scope.get("state")
        if state is None:
            state = scope["state"] = {}
        state["request_id"] = rid
        rid_header = (b"x-request-id", rid.encode())
        path = scope["path"]
        api = path.startswith(API_PREFIXES)
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", ()), rid_header]
                if state.get("instances"):
                    headers.append((b"x-mindmotor-instance", state["instances"].encode()))
                if state.get("versions"):
                    headers.append((b"x-mindmotor-version", state["versions"].encode()))
                if state.get("ignored_fields"):
                    headers.append((b"x-mindmotor-ignored-fields", header_value(state["ignored_fields"]).encode()))
                message = {**message, "headers": headers}
            await send(message)

        counted = api and self.in_flight is not None
        if counted:
            self.in_flight.requests += 1
        token = request_id_var.set(rid)
        try:
            if api and path not in ADMIN_PATHS:         # the admin token is their credential (routes/lora.py)
                if self.keys.enabled or self.limiter is not None:
                    try:
                        state["caller"] = await self._gate(scope, authorization)
                    except APIError as exc:
                        return await send_error(send_with_id, exc)
                else:
                    client = scope.get("client")
                    state["caller"] = f"ip:{client[0]}" if client else "anonymous"
            if scope["method"] not in _BODYLESS:
                receive = await self._read_body(length, receive, send_with_id)
                if receive is None:
                    return
            await self.app(scope, receive, send_with_id)
        finally:
            if counted:
                self.in_flight.requests -= 1
            if api:
                self._count(getattr(scope.get("route"), "path", None) or "unmatched", state.get("model", ""),
                            status or 499)
            self._log(scope, path, api, status, started, state)
            request_id_var.reset(token)

    # ---- the gate -----------------------------------------------------------------------------
    async def _gate(self, scope: Scope, authorization: bytes | None) -> str:
        """The caller's identity (its key's, or its address without keys); 401 or 429 raised."""
        if self.keys.enabled:
            try:
                identity = self.keys.check(authorization.decode("latin-1") if authorization is not None else None)
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

    # ---- the body limit -----------------------------------------------------------------------
    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"the request body exceeds the limit of {self.max_body_bytes} bytes",
                               code="body_too_large")

    async def _read_body(self, length: bytes | None, receive: Receive, send: Send) -> Receive | None:
        """The whole body read (413 sent and None returned when over the limit, None when the client
        went away first), handed on by the returned `receive`."""
        if length is not None and length.strip().isdigit() and int(length) > self.max_body_bytes:
            await send_error(send, self._too_large())
            return None
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body = message.get("body", b"")
        if len(body) > self.max_body_bytes:
            await send_error(send, self._too_large())
            return None
        if message.get("more_body", False):
            chunks, size = [body], len(body)
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return None
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_body_bytes:
                    await send_error(send, self._too_large())
                    return None
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

        return replay

    # ---- when it ends -------------------------------------------------------------------------
    def _count(self, route: str, model: str, status: int) -> None:
        key = (route, model, status)
        child = self._counters.get(key)
        if child is None:
            if len(self._counters) >= _MAX_CACHED_LABELS:
                self._counters.clear()
            child = self._counters[key] = self.metrics.requests.labels(route, model, str(status))
        child.inc()

    def _log(self, scope: Scope, path: str, api: bool, status: int, started: float, state: dict) -> None:
        # probes and scrapes (/health, /metrics) every few seconds are not news unless they fail; a
        # 5xx always is; otherwise a sample of the requests (none by default) at INFO, all at DEBUG
        if status >= 500 or (not api and not 200 <= status < 400):
            level = logging.INFO
        elif self.access_sample and api:
            self._sampled += self.access_sample
            if self._sampled >= 1.0:
                self._sampled -= 1.0
                level = logging.INFO
            else:
                level = logging.DEBUG
        else:
            level = logging.DEBUG
        if not log.isEnabledFor(level):
            return
        log.log(level, "request", extra={"method": scope.get("method"), "path": path, "status": status,
                                         "duration_s": round(time.perf_counter() - started, 6),
                                         "model": state.get("model"), "instance": state.get("instances") or None,
                                         "version": state.get("versions") or None})
