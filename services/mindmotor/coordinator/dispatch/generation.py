"""`Generation`: one choice of one request, streamed from a worker — and from another one, which
continues after the tokens already produced, when that worker fails.

Failures are classified (`failures.py`). A request the worker calls bad is a 400, never
retried. An instance failure — a call ending in UNAVAILABLE (the worker died, was unreachable,
or is draining), a stream that ends without finishing or with finish_reason "abort" (a worker
that cut its drain short), or a stream given up as silent by the progress guard (`progress.py`:
no token and no keepalive for `stream_progress_timeout_s`, or silent on an instance the routing
table says failed: a frozen worker) — marks the instance in the routing table (skipped for a while,
listeners told) and the request goes to another instance, at most `max_retry` times, with the
tokens and characters the client already has (`GenerateRequest.continuation`). That worker continues
the request as the failed one would have (the seeded random stream, penalties and token limits
over the whole output, stop strings across the move), so the client sees one stream, no token
lost or repeated: the tokens and text of an undisturbed run, sampled or greedy.

A busy instance (at its limit of concurrent calls) is skipped for this request only; when every
instance is busy the answer is 429. A request that failed *on* two instances (their engines
raised for it, or died) is not sent to a third: the client gets an error that says so, and
instances whose engine merely raised are not marked.

Closing the stream (the client went away) cancels the gRPC call, which aborts the request on
the worker and frees its KV blocks.

When the model has prefill and decode instances, a choice starts with the prefill/decode split
(`pd_split`): the first token from a prefill instance, the rest from a decode instance that pulls
the prompt's KV; any failure of the split falls back to the ordinary path above.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import AsyncIterator

import grpc

from mindmotor.common.tracing import Tracing
from mindmotor.protocol import worker_pb2 as pb
from mindmotor.vocabulary import FailureKind, FinishReason
from mindmotor.protocol.request_digest import request_digest

from mindmotor.coordinator.dispatch.channels import WorkerChannels
from mindmotor.coordinator.http.errors import APIError, InternalError, ServiceUnavailable, TooManyRequests
from mindmotor.coordinator.dispatch.failures import MAX_REQUEST_FAILURES, OwnCancellation, WorkerFailure, classify
from mindmotor.coordinator.routing.table import InstanceView
from mindmotor.coordinator.metrics import ChoiceTimer, CoordinatorMetrics
from mindmotor.coordinator.dispatch.progress import UNWATCHED, ProgressGuard
from mindmotor.coordinator.dispatch.pd_split import (HANDOFF_ROLES, ORDINARY_ROLES, PREFILL_ROLES, Handoff, Releaser,
                       prefill_request, split_available)
from mindmotor.coordinator.routing.router import NoInstanceAvailable as NoInstanceAvailableError, Router
from mindmotor.coordinator.routing.policies import RouteRequest
from mindmotor.coordinator.openai.sampling import SamplingOptions

log = logging.getLogger("mindmotor.coordinator")


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


@dataclass
class Piece:
    """What a choice adds to the client's stream."""
    token_ids: list[int]
    text: str
    logprobs: list[pb.TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None          # "stop" | "length" on the last piece
    stop_reason: int | str | None = None      # the stop token id or stop string, for "stop"
    usage: Usage | None = None                # on the last piece
    prompt_logprobs: list[pb.TokenLogprob] = field(default_factory=list)   # on the first, when asked
    source: tuple[str, str] = ("", "")        # (instance, worker call's request id) that produced it
    timings: pb.RequestTimings | None = None  # on the last piece: the worker call's phases, when it sent them


@dataclass
class GenerationRequest:
    request_id: str
    model: str
    prompt_token_ids: list[int]
    sampling: SamplingOptions
    max_new_tokens: int                       # resolved max_tokens (for the load estimate)
    priority: int = 0
    versions: frozenset[str] | None = None    # the versions its prompt was tokenized for (None: any)
    lora: str | None = None                   # the LoRA adapter (None: the base model)


class Generation:
    def __init__(self, request: GenerationRequest, router: Router, channels: WorkerChannels,
                 metrics: CoordinatorMetrics, timer: ChoiceTimer, max_retry: int = 5,
                 prefill_timeout_s: float = 60.0, releaser: Releaser | None = None,
                 retry_after_s: float = 1.0, guard: ProgressGuard | None = None):
        self.request = request
        self.guard = guard
        self.prefill_timeout_s = prefill_timeout_s
        self.releaser = releaser or Releaser(channels)
        self.handoff: Handoff | None = None   # the prompt prefilled elsewhere, until decoded
        self.router = router
        self.channels = channels
        self.metrics = metrics
        self.timer = timer
        self.max_retry = max_retry
        self.produced: list[int] = []         # every token the client has been given
        self.sent_chars = 0                   # characters of text the client has been given
        self.failures = 0                     # failed attempts, busy ones aside (bounded by max_retry)
        self.failed_on: list[tuple[str, str]] = []   # (instance, reason) where the request itself failed
        self.busy: set[str] = set()           # instances that refused it as busy
        self.retry_after_s = retry_after_s
        self.instances: list[str] = []        # where each attempt went
        self.route = RouteRequest(request.prompt_token_ids, request.max_new_tokens, lora=request.lora)
        self.source: tuple[str, str] = ("", "")   # the current worker call (instance, request id)
        self._final: Piece | None = None          # resumed after its last token: only the finish is left
        self.tracing = None                       # common.tracing.Tracing when traces are exported
        self.trace_parent = None                  # the client's traceparent, extracted
        self.span = None                          # this choice's span while it runs
        self.unary = False                        # whole answers (GenerateUnary): nobody reads it piece by piece

    @property
    def digest(self) -> bytes:
        """What the worker calls of this choice ask for (protocol/request_digest.py)."""
        return request_digest(self.request.prompt_token_ids, self.request.sampling.to_proto())

    def resume_from(self, produced: list[int], sent_chars: int, finish_reason: str | None = None,
                    stop_reason: int | str | None = None) -> None:
        """Continue a choice whose client has `produced` and `sent_chars` characters (a stream
        resumed on this coordinator: resume.py); with `finish_reason`, the choice had finished and
        only its finish is left to send."""
        self.produced, self.sent_chars = list(produced), sent_chars
        if finish_reason:
            prompt = len(self.request.prompt_token_ids)
            self._final = Piece([], "", finish_reason=finish_reason, stop_reason=stop_reason,
                                usage=Usage(prompt_tokens=prompt, completion_tokens=len(self.produced)))

    async def stream(self) -> AsyncIterator[Piece]:
        """The pieces of this choice, the last one with finish_reason and usage."""
        req = self.request
        tried: set[str] = set()
        if self._final is not None:
            yield self._final
            return
        self.timer.begin()
        if self.tracing is not None:
            self.span = self.tracing.start("mindmotor.choice", self.trace_parent, self.timer.arrival, {
                "mindmotor.request_id": req.request_id, "mindmotor.model": req.model,
                "mindmotor.class": self.timer.slo_class, "mindmotor.priority": req.priority}, clock=time.perf_counter)
        try:
            if not self.produced and split_available(self.router.table, req.model):
                first = await self._prefill_remotely()
                if first is not None:
                    if first.finish_reason is not None:
                        self._finished(first)       # before the yield: a consumer may stop at the last piece
                    yield first
                    if first.finish_reason is not None:
                        return
            while True:
                instance = self._pick(tried, HANDOFF_ROLES if self.handoff else ORDINARY_ROLES)
                tried.add(instance.instance_id)
                self.instances.append(instance.instance_id)
                try:
                    async for piece in (self._attempt_unary if self.unary else self._attempt)(instance):
                        if piece.finish_reason is not None:
                            self._finished(piece)   # before the yield: a consumer may stop at the last piece
                        yield piece
                        if piece.finish_reason is not None:
                            return
                    raise WorkerFailure("the stream ended before the request finished")
                except WorkerFailure as failure:
                    self._on_failure(instance, failure)
                self._drop_handoff()                  # resubmitted: the produced tokens are computed there
        finally:
            self.timer.end()
            self._drop_handoff()
            if self.span is not None:
                self.span.set_attribute("mindmotor.output_tokens", len(self.produced))
                self.span.end()

    def _finished(self, piece: Piece) -> None:
        self.timer.on_finish(piece.finish_reason, piece.usage, piece.timings)

    def _pick(self, tried: set[str], role_groups) -> InstanceView:
        """An instance of the first role group that has one not yet tried; when every instance has
        been tried, any routable one again (failed ones are suspect) except those that said they
        are busy. TooManyRequests when only busy ones are left."""
        model = self.request.model
        for roles in role_groups:
            try:
                return self.router.pick(model, self.route, exclude=tried | self.busy, roles=roles,
                                        versions=self.request.versions)
            except ServiceUnavailable:
                continue
        if not tried:
            raise NoInstanceAvailableError(model)
        try:
            return self.router.pick(model, self.route, exclude=self.busy, versions=self.request.versions)
        except ServiceUnavailable:
            if not self.busy:
                raise
        self.metrics.rejected.labels("instances_busy").inc()
        raise TooManyRequests(
            f"every instance of model {model!r} is at its limit of concurrent requests; retry later",
            retry_after_s=self.retry_after_s, code="instances_busy")

    # ---- the prefill/decode split -------------------------------------------------------------
    async def _prefill_remotely(self) -> Piece | None:
        """The first token from a prefill instance (the KV stays pinned there: `self.handoff`), or
        None to run the choice the ordinary way (no prefill instance, or it failed)."""
        req = self.request
        try:
            instance = self.router.pick(req.model, self.route, roles=PREFILL_ROLES, versions=req.versions)
        except ServiceUnavailable:
            return None
        cost = len(req.prompt_token_ids)
        call_id = f"{req.request_id}.p.{secrets.token_hex(3)}"
        self.source = (instance.instance_id, call_id)
        call_span = None
        if self.span is not None:
            call_span = self.tracing.start("mindmotor.prefill_call", self.span, attributes={
                "mindmotor.instance_id": instance.instance_id, "mindmotor.worker_request_id": call_id})
        call = self.channels.stub(instance.address).Prefill(
            prefill_request(call_id, req.prompt_token_ids, req.sampling.to_proto(), req.priority, req.lora),
            timeout=self.prefill_timeout_s, metadata=Tracing.inject(call_span) or None)
        watch = self._watch(instance, call, deadline=False)     # unary: no keepalives, only the table's word
        self.router.table.begin(instance.instance_id, cost)
        self.metrics.routed.labels(req.model, instance.instance_id).inc()
        try:
            watch.waiting()
            response = await call
        except (grpc.aio.AioRpcError, asyncio.CancelledError) as exc:
            error = _given_up(watch, exc)
            if error is None:
                if isinstance(exc, asyncio.CancelledError):
                    raise
                error = classify(exc)
            if not isinstance(error, (WorkerFailure, OwnCancellation)):
                raise error from None
            if isinstance(error, WorkerFailure) and error.marks_instance:
                self.router.table.mark_failed(instance.instance_id, error.reason)
            self.metrics.pd_fallbacks.labels(req.model, "prefill_failed").inc()
            log.warning("remote prefill failed; computing the prompt on the decode side",
                        extra={"instance_id": instance.instance_id, "reason": str(error)})
            return None
        finally:
            watch.close()
            call.cancel()
            self.router.table.end(instance.instance_id, cost)
            if call_span is not None:
                call_span.end()
        if response.handle:
            self.handoff = Handoff(instance, response)
        self.instances.append(instance.instance_id)
        self.metrics.pd_prefills.labels(req.model).inc()
        piece = self._piece(response)
        self.timer.on_tokens(len(piece.token_ids))
        return piece

    def _drop_handoff(self) -> None:
        """Forget the handoff; release its KV if no decode instance took it."""
        handoff, self.handoff = self.handoff, None
        if handoff is not None and not handoff.pulled:
            self.releaser.release(handoff)

    def _on_failure(self, instance: InstanceView, failure: WorkerFailure) -> None:
        """Account for a failed attempt; raise when the request must not be tried again."""
        req = self.request
        reason = failure.reason
        self.metrics.retries.labels(req.model, reason.split(":", 1)[0]).inc()
        extra = {"instance_id": instance.instance_id, "reason": reason, "kind": failure.kind,
                 "produced_tokens": len(self.produced)}
        if failure.kind == FailureKind.BUSY:
            self.busy.add(instance.instance_id)
            log.info("instance busy; trying another", extra=extra)
            return
        self.failures += 1
        if failure.marks_instance:
            self.router.table.mark_failed(instance.instance_id, reason)
        if failure.counts_against_request:
            self.failed_on.append((instance.instance_id, reason))
        if self.produced:
            self.metrics.migrations.labels(req.model).inc()
        log.warning("worker failed the request; resubmitting", extra={
            **extra, "attempt": self.failures, "max_retry": self.max_retry})
        if len(self.failed_on) >= MAX_REQUEST_FAILURES:
            self.metrics.rejected.labels("failed_on_instances").inc()
            where = "; ".join(f"{i}: {r}" for i, r in self.failed_on)
            count = len({i for i, _ in self.failed_on})
            raise InternalError(
                f"the request failed {len(self.failed_on)} times, on {count} instance{'s' if count > 1 else ''} "
                f"({where}); it is not sent to another one, as it is likely what fails there",
                code="request_failed_on_instances")
        if self.failures > self.max_retry:
            raise ServiceUnavailable(f"the request failed on {self.failures} instances (last: {reason}); "
                                     "giving up", code="max_retry_exceeded")

    def _worker_request(self) -> pb.GenerateRequest:
        req = self.request
        # unique even when clients reuse an X-Request-Id: a clash on the worker is not its failure
        attempt_id = f"{req.request_id}.{len(self.instances) - 1}.{secrets.token_hex(3)}"
        out = pb.GenerateRequest(request_id=attempt_id, sampling=req.sampling.to_proto(), priority=req.priority,
                                 lora_name=req.lora or "")
        out.prompt_token_ids.ids.extend(req.prompt_token_ids)
        if self.produced:       # continue after what the client has: moved, or the decode half of a split
            out.continuation.output_token_ids.extend(self.produced)
            out.continuation.sent_chars = self.sent_chars
            if self.handoff is not None:    # the prompt's KV is pinned on the prefill instance
                out.continuation.kv_source.CopyFrom(self.handoff.kv_source())
        return out

    def _watch(self, instance: InstanceView, call, deadline: bool = True):
        if self.guard is None:
            return UNWATCHED
        return self.guard.watch(instance, call.cancel, self.request.model, self.request.request_id, deadline)

    async def _attempt(self, instance: InstanceView) -> AsyncIterator[Piece]:
        """The pieces from one worker; WorkerFailure when it fails (after yielding what it made),
        also when the progress guard gave the call up as silent."""
        req = self.request
        cost = self.route.cost_tokens
        worker_request = self._worker_request()
        self.source = (instance.instance_id, worker_request.request_id)
        call_span = None
        if self.span is not None:
            call_span = self.tracing.start("mindmotor.worker_call", self.span, attributes={
                "mindmotor.instance_id": instance.instance_id, "mindmotor.worker_request_id": worker_request.request_id})
            call = self.channels.stub(instance.address).Generate(worker_request, metadata=Tracing.inject(call_span))
        else:
            call = self.channels.stub(instance.address).Generate(worker_request)
        self.timer.on_call()
        watch = self._watch(instance, call)
        self.router.table.begin(instance.instance_id, cost)
        self.metrics.routed.labels(req.model, instance.instance_id).inc()
        try:
            while True:
                watch.waiting()                     # the clock runs only while we wait for the worker
                response = await call.read()
                watch.received()
                if response is grpc.aio.EOF:
                    return
                if response.keepalive:              # the worker is alive and on it; nothing for the client
                    continue
                if self.handoff is not None:
                    self.handoff.pulled = True      # the decode worker released the KV itself
                if response.finish_reason == FinishReason.ABORT:
                    raise WorkerFailure("ABORTED: the worker aborted the request (draining)")
                piece = self._piece(response)
                self.timer.on_tokens(len(piece.token_ids))
                yield piece
                if piece.finish_reason is not None:
                    return
        except asyncio.CancelledError as exc:
            error = _given_up(watch, exc)
            if error is None:
                raise
            raise error from None
        except grpc.aio.AioRpcError as exc:
            error = _given_up(watch, exc) or classify(exc)
            if isinstance(error, APIError) and self.produced:
                log.error("worker refused a resubmitted request", extra={"error": error.message})
            if isinstance(error, OwnCancellation):
                raise asyncio.CancelledError(str(error)) from None
            raise error from None
        finally:
            watch.close()
            call.cancel()
            self.router.table.end(instance.instance_id, cost)
            if call_span is not None:
                call_span.end()

    async def _attempt_unary(self, instance: InstanceView) -> AsyncIterator[Piece]:
        """`_attempt` as one unary call (GenerateUnary): the whole output as one piece. The call
        carries no keepalives, so the progress guard watches it for the routing table's word only
        (as Prefill); a failure loses nothing the client has (it has nothing yet)."""
        req = self.request
        cost = self.route.cost_tokens
        worker_request = self._worker_request()
        self.source = (instance.instance_id, worker_request.request_id)
        stub = self.channels.stub(instance.address)
        call_span = None
        if self.span is not None:
            call_span = self.tracing.start("mindmotor.worker_call", self.span, attributes={
                "mindmotor.instance_id": instance.instance_id, "mindmotor.worker_request_id": worker_request.request_id})
            call = stub.GenerateUnary(worker_request, metadata=Tracing.inject(call_span))
        else:
            call = stub.GenerateUnary(worker_request)
        self.timer.on_call()
        watch = self._watch(instance, call, deadline=False)
        self.router.table.begin(instance.instance_id, cost)
        self.metrics.routed.labels(req.model, instance.instance_id).inc()
        try:
            watch.waiting()
            response = await call
            watch.received()
            if self.handoff is not None:
                self.handoff.pulled = True          # the decode worker released the KV itself
            if response.finish_reason == FinishReason.ABORT:
                raise WorkerFailure("ABORTED: the worker aborted the request (draining)")
            piece = self._piece(response)
            self.timer.on_whole(len(piece.token_ids), piece.timings)
        except asyncio.CancelledError as exc:
            error = _given_up(watch, exc)
            if error is None:
                raise
            raise error from None
        except grpc.aio.AioRpcError as exc:
            error = _given_up(watch, exc) or classify(exc)
            if isinstance(error, APIError) and self.produced:
                log.error("worker refused a resubmitted request", extra={"error": error.message})
            if isinstance(error, OwnCancellation):
                raise asyncio.CancelledError(str(error)) from None
            raise error from None
        finally:
            watch.close()
            call.cancel()
            self.router.table.end(instance.instance_id, cost)
            if call_span is not None:
                call_span.end()
        yield piece

    def _piece(self, response: pb.GenerateResponse | pb.PrefillResponse) -> Piece:
        token_ids = list(response.token_ids)
        finish = response.finish_reason or None
        kind = response.WhichOneof("stop_reason")
        self.produced.extend(token_ids)
        self.sent_chars += len(response.text)
        piece = Piece(token_ids=token_ids, text=response.text, logprobs=list(response.logprobs),
                      finish_reason=finish, stop_reason=getattr(response, kind) if kind else None,
                      prompt_logprobs=list(response.prompt_logprobs), source=self.source)
        if finish is not None:
            prompt = len(self.request.prompt_token_ids)
            cached = response.usage.cached_tokens if response.HasField("usage") else 0
            piece.usage = Usage(prompt_tokens=prompt, completion_tokens=len(self.produced),
                                cached_tokens=min(cached, prompt))
            if isinstance(response, pb.GenerateResponse) and response.HasField("timings"):
                piece.timings = response.timings
        return piece


def _given_up(watch, exc: BaseException) -> WorkerFailure | None:
    """The progress guard's failure when it is what ended the call: it cancelled the call (which
    the reader sees as a CancelledError of its own, or a CANCELLED status) and this task itself is
    not being cancelled (the client went away)."""
    if watch.failure is None:
        return None
    task = asyncio.current_task()
    if isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling():
        return None
    return watch.failure
