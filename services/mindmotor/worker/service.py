"""`WorkerService`: the Worker RPCs (worker.proto) over one `AsyncLLMEngine`.

Generate streams one chunk per engine output, and a `keepalive` message whenever the stream has
been silent for `stream_keepalive_s` while the engine makes progress (queued, a long prefill, a
KV pull): a frozen worker — or one whose engine thread is stuck — goes silent instead, which is
what the coordinator's progress deadline detects. A request the engine refuses fails alone with
INVALID_ARGUMENT; one the engine raised for fails alone with INTERNAL (trailing metadata
`mindmotor-failure: request`); a dead engine answers UNAVAILABLE (`mindmotor-failure: engine`).
Over the limit of concurrent requests a call is refused with RESOURCE_EXHAUSTED. A client that
cancels or goes away cancels this handler's task, which closes the engine stream, which aborts
the request and frees its KV blocks. A request with a `continuation` (moved here after its
worker failed, or the decode half of a prefill/decode split) continues after its output so far,
which it does not repeat.

Prefill/decode split: `Prefill` runs a prefill-only request (first token back, KV pinned under
its request id); `PullKV` streams a pinned KV to a decode worker, `ReleaseKV` frees it — both
through the worker side of the KV connector (`kv_connector.WorkerKVConnector`), which also pulls
the KV of a continuation with a KV source while the engine holds it in `WAITING_FOR_KV`.
`SetRole` switches the role after draining (`RoleSwitch`).

The model is served (Status, ModelInfo) under `model_name`: `--served-model-name`, else the
checkpoint directory's name.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from contextlib import aclosing
from typing import NoReturn

import grpc

from mindmotor.common.logging import request_context
from mindmotor.common.roles import Role
from mindmotor.common.tracing import CURRENT_SPAN, Tracing, wall_ns
from mindmotor.vocabulary import FinishReason, RefusalReason
from mindmotor.engine.async_engine import KEEPALIVE, AsyncLLMEngine, EngineDeadError, RequestFailed
from mindmotor.engine.continuation import Continuation
from mindmotor.engine.llm_engine import RequestError
from mindmotor.rules.sampling_params import SamplingParams
from mindmotor.protocol import worker_pb2 as pb
from mindmotor.protocol.failure import ENGINE_DEAD, FAILURE_METADATA_KEY, PARAM_METADATA_KEY, REQUEST_FAILED
from mindmotor.protocol import worker_pb2_grpc

from .admission import Admission
from .convert import (continuation_from_request, device_status_from_snapshot, load_from_stats, prefill_response,
                      prompt_from_request, response_from_output, response_from_outputs, sampling_params_from_proto)
from .kv_connector import WorkerKVConnector
from .metrics import WorkerMetrics
from .model_info import digest_only, read_model_info
from .recall import OutputRecall, Recalled
from .roles import RoleSwitch
from mindmotor.protocol.request_digest import request_digest
from mindmotor.sandbox.spec_check import SpecChecker, SpecsBusy

log = logging.getLogger("mindmotor.worker")


class WorkerService(worker_pb2_grpc.WorkerServicer):
    def __init__(self, engine: AsyncLLMEngine, admission: Admission, metrics: WorkerMetrics,
                 worker_id: str, model_name: str, role: Role | str = Role.MIXED, node: str = "",
                 kv_pull_timeout_s: float = 5.0, role_drain_timeout_s: float = 30.0,
                 specs: SpecChecker | None = None, stream_keepalive_s: float = 0.0,
                 recall: OutputRecall | None = None, tracing: Tracing | None = None,
                 injected_delay: tuple[str, float] | None = None):
        self.engine = engine
        self.injected_delay = injected_delay    # tests only (--inject-delay): (phase, seconds) of every Generate
        self.tracing = tracing or Tracing("mindmotor-worker")     # off unless an endpoint
        self.recall = recall or OutputRecall()   # every call's output, for a coordinator that takes over
        self.specs = specs                # None: specs are compiled by the engine alone (tests, tools)
        self.stream_keepalive_s = stream_keepalive_s
        self.admission = admission
        self.metrics = metrics
        self.worker_id = worker_id
        self.model_name = model_name
        self.node = node
        self.model_info = read_model_info(engine.info.model_dir, model_name, engine.info.max_model_len)
        self.model_digest = digest_only(self.model_info)
        self.roles = RoleSwitch(admission, role, role_drain_timeout_s)
        self.kv = WorkerKVConnector(engine, metrics, node, kv_pull_timeout_s, tracing=self.tracing)

    @property
    def role(self) -> Role:
        return self.roles.role

    # ---- Generate ----------------------------------------------------------------------------
    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> None:
        await self._generate(request, context, None)

    async def GenerateUnary(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
                            ) -> pb.GenerateResponse:
        """Generate as one answer (a non-streamed HTTP request): no message per output, no
        keepalives; the same admission, refusals and cancellation."""
        outputs: list = []
        await self._generate(request, context, outputs)
        return outputs[0]

    async def _generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext,
                        collect: list | None) -> None:
        """Run one request; its outputs written as they come (`collect` None) or, when the call
        ends, its one response put into `collect`."""
        request_id = request.request_id or uuid.uuid4().hex
        with request_context(request_id):
            prompt, params, continuation = await self._admit(request_id, request, context)
            if continuation is not None:
                log.info("continuing a request begun elsewhere", extra={
                    "output_tokens": len(continuation.output_token_ids),
                    "kv_source": continuation.kv_source.address if continuation.kv_source else None})
            record = self.recall.start(request_id, request_digest(prompt, request.sampling),
                                       list(continuation.output_token_ids) if continuation else [])
            keepalive_s = self.stream_keepalive_s if collect is None else 0.0
            try:
                with self.admission.track(request_id):
                    await self._stream(lambda: self.engine.generate(request_id, prompt, params, request.priority,
                                                                    continuation=continuation,
                                                                    keepalive_s=keepalive_s,
                                                                    lora=request.lora_name or None),
                                       context, request_id, record, collect)
            finally:
                self.recall.end(request_id, record)

    async def _admit(self, request_id: str, request, context
                     ) -> tuple[str | list[int], SamplingParams, Continuation | None]:
        """Refuse (raising) when the engine died, when draining, when at the concurrency limit, for
        a duplicate id or a malformed request."""
        if self.engine.dead is not None or self.admission.failed:
            self.metrics.refused.labels(reason=RefusalReason.ENGINE_DEAD).inc()
            await _refuse(context, grpc.StatusCode.UNAVAILABLE,
                          "this worker's engine has stopped; the worker is going away: send it elsewhere",
                          ENGINE_DEAD)
        if not self.admission.accepting:
            await _refuse(context, grpc.StatusCode.UNAVAILABLE,
                          "the worker is draining and takes no new requests; send it elsewhere")
        if self.admission.full:
            self.metrics.refused.labels(reason=RefusalReason.BUSY).inc()
            await _refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"the worker is at its limit of {self.admission.max_in_flight} concurrent requests; "
                          "send it elsewhere or retry later")
        if request_id in self.admission.in_flight:
            await _refuse(context, grpc.StatusCode.ALREADY_EXISTS,
                          f"request id {request_id!r} is already in use")
        try:
            continuation = continuation_from_request(request) if isinstance(request, pb.GenerateRequest) else None
            params = sampling_params_from_proto(request.sampling)
            prompt = prompt_from_request(request)
            if self.specs is not None:
                await self.specs.check(params.structured)    # a helper compiles it first (mindmotor.sandbox)
            return prompt, params, continuation
        except ValueError as exc:
            self.metrics.refused.labels(reason=RefusalReason.INVALID_ARGUMENT).inc()
            await _refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc), param=getattr(exc, "param", None))
        except SpecsBusy as exc:
            self.metrics.refused.labels(reason=RefusalReason.BUSY).inc()
            await _refuse(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"the structured-output compilers of this worker are busy: {exc}")

    async def _stream(self, open_outputs, context: grpc.aio.ServicerContext, request_id: str,
                      record: Recalled, collect: list | None = None) -> None:
        """Write every output of `open_outputs()` (raises RequestError for a refused request),
        each also kept in `record` (Recall); with `collect`, no writes: the outputs as one
        response, appended to `collect` once the request finished."""
        timer = self.metrics.request_timer()
        finish_reason = FinishReason.CANCELLED  # unless the engine finishes it: the client went away
        outs: list = []
        span = self._call_span(context, request_id, timer) if self.tracing.enabled else None
        current = CURRENT_SPAN.set(span)
        delay_phase, delay_s = self.injected_delay or ("", 0.0)
        try:
            if delay_phase == "worker_queue":
                await asyncio.sleep(delay_s)
            async with aclosing(open_outputs()) as outputs:
                async for out in outputs:
                    if out is KEEPALIVE:
                        self.metrics.keepalives.inc()
                        await context.write(pb.GenerateResponse(request_id=request_id, keepalive=True))
                        continue
                    timer.on_tokens(len(out.new_token_ids))
                    record.output_token_ids.extend(out.new_token_ids)
                    timings = None
                    if out.finished:
                        timings = timer.timings(out)
                        if span is not None:
                            self._end_call_span(span, timer, timings, out)
                            span = None
                        record.finish_reason, record.stop_reason = out.finish_reason or "", out.stop_reason
                        # Before the write: a client that closes the call as soon as it has the last
                        # message may cancel the write, but the request finished, not "cancelled".
                        finish_reason = out.finish_reason
                        if log.isEnabledFor(logging.DEBUG):     # per request: DEBUG (issue 26)
                            log.debug("request finished", extra={
                                "finish_reason": finish_reason, "prompt_tokens": out.num_prompt_tokens,
                                "completion_tokens": out.num_output_tokens,
                                "cached_tokens": out.num_cached_tokens, "ttft_s": timer.ttft_s,
                                "duration_s": timer.elapsed_s})
                    if out.finished and delay_phase == "network":
                        await asyncio.sleep(delay_s)
                    if collect is None:
                        await context.write(response_from_output(out, timings))
                    else:
                        outs.append(out)
                        if out.finished:
                            collect.append(response_from_outputs(outs, timings))
        except RequestError as exc:
            finish_reason = None
            self.metrics.refused.labels(reason=RefusalReason.INVALID_ARGUMENT).inc()
            await _refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc), param=exc.param)
        except RequestFailed as exc:
            finish_reason = FinishReason.ERROR
            await _refuse(context, grpc.StatusCode.INTERNAL, f"the engine failed this request: {exc}",
                          REQUEST_FAILED)
        except EngineDeadError as exc:
            finish_reason = FinishReason.ERROR
            log.error("the engine is dead", extra={"error": str(exc)})
            await _refuse(context, grpc.StatusCode.UNAVAILABLE, f"this worker's engine has stopped: {exc}",
                          ENGINE_DEAD)
        finally:
            CURRENT_SPAN.reset(current)
            if span is not None:                  # refused, failed or cancelled
                span.set_attribute("mindmotor.finish_reason", str(finish_reason or "refused"))
                span.end()
            self.kv.trace_parents.pop(request_id, None)
            if finish_reason is not None:
                timer.on_finish(finish_reason)
            if finish_reason == FinishReason.CANCELLED:
                log.info("request cancelled by the client; aborted", extra={"duration_s": timer.elapsed_s})
        if collect is not None and not collect:     # the engine's stream ended without a finish
            await _refuse(context, grpc.StatusCode.INTERNAL, "the engine ended the request without finishing it",
                          REQUEST_FAILED)

    def _call_span(self, context, request_id: str, timer):
        """The call's span, under the caller's traceparent, open while the call runs: a KV pull
        for it (`kv_connector`) is its child."""
        span = self.tracing.start("mindmotor.worker.generate", self.tracing.extract(context.invocation_metadata() or ()),
                                  timer.started, {"mindmotor.request_id": request_id,
                                                  "mindmotor.worker_id": self.worker_id})
        self.kv.trace_parents[request_id] = span
        return span

    def _end_call_span(self, span, timer, timings, out) -> None:
        """The finished call's figures, and its queue / prefill / decode (`RequestTimings`: they tile
        the call) as attributes and two events (the first step, the first token) — no span per
        phase: spans are what tracing costs (benchmarks/tracing_overhead.py)."""
        scheduled = timer.started + timings.queued_s
        first_token = scheduled + timings.prefill_s
        end = first_token + timings.decode_s
        span.set_attributes({
            "mindmotor.prompt_tokens": out.num_prompt_tokens, "mindmotor.output_tokens": out.num_output_tokens,
            "mindmotor.cached_tokens": out.num_cached_tokens, "mindmotor.preemptions": timings.preemptions,
            "mindmotor.finish_reason": str(out.finish_reason or ""), "mindmotor.queue_s": timings.queued_s,
            "mindmotor.prefill_s": timings.prefill_s, "mindmotor.decode_s": timings.decode_s})
        if out.kv_tier_load is not None:         # its prefix loaded from the KV host tier
            start, end_at, blocks = out.kv_tier_load
            self.tracing.span_after("mindmotor.worker.kv_tier_load", span, start, end_at, {"mindmotor.blocks": blocks})
        span.add_event("mindmotor.worker.scheduled", timestamp=wall_ns(scheduled))
        span.add_event("mindmotor.worker.first_token", timestamp=wall_ns(first_token))
        span.end(wall_ns(end))

    # ---- Abort, Status, ModelInfo, Drain ----------------------------------------------------------------
    async def Abort(self, request: pb.AbortRequest, context) -> pb.AbortResponse:
        found = request.request_id in self.admission.in_flight
        if found:
            self.engine.abort(request.request_id)
            with request_context(request.request_id):
                log.info("request aborted by Abort")
        return pb.AbortResponse(found=found)

    async def Recall(self, request: pb.RecallRequest, context) -> pb.RecallResponse:
        record = self.recall.get(request.request_id)
        if record is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no output of request {request.request_id!r} here "
                                f"(unknown, or ended more than {self.recall.retention_s:g} s ago)")
        out = pb.RecallResponse(digest=record.digest, output_token_ids=record.output_token_ids,
                                finish_reason=record.finish_reason)
        if isinstance(record.stop_reason, str):
            out.stop_string = record.stop_reason
        elif record.stop_reason is not None:
            out.stop_token_id = record.stop_reason
        return out

    async def Status(self, request: pb.StatusRequest, context) -> pb.StatusResponse:
        return self.status()

    def status(self) -> pb.StatusResponse:
        info = self.engine.info
        return pb.StatusResponse(
            worker_id=self.worker_id, model=self.model_name, max_model_len=info.max_model_len,
            block_size=info.block_size, role=self.role.to_proto(), state=self.admission.state,
            load=load_from_stats(self.engine.stats(), len(self.admission.in_flight)),
            device=device_status_from_snapshot(self.engine.device_snapshot()),
            emulated_profile=info.profile_name, timing=info.timing, node=self.node)

    async def ModelInfo(self, request: pb.ModelInfoRequest, context) -> pb.ModelInfoResponse:
        return self.model_digest if request.digest_only else self.model_info

    # ---- Prefill, PullKV, ReleaseKV, SetRole -------------------------------------------------
    async def Prefill(self, request: pb.PrefillRequest, context) -> pb.PrefillResponse:
        if not self.tracing.enabled:
            return await self._prefill(request, context)
        with self.tracing.span("mindmotor.worker.prefill_only", self.tracing.extract(context.invocation_metadata() or ()),
                               attributes={"mindmotor.request_id": request.request_id,
                                           "mindmotor.worker_id": self.worker_id}):
            return await self._prefill(request, context)

    async def _prefill(self, request: pb.PrefillRequest, context) -> pb.PrefillResponse:
        request_id = request.request_id or uuid.uuid4().hex
        with request_context(request_id):
            prompt, params, _ = await self._admit(request_id, request, context)
            with self.admission.track(request_id):
                timer = self.metrics.request_timer()
                ids: list[int] = []
                try:
                    validated = self.engine.validate(prompt, params, lora=request.lora_name or None)
                    ids = validated.prompt_token_ids
                    async with aclosing(self.engine.submit(request_id, validated, request.priority,
                                                           prefill_only=True)) as outputs:
                        out = None
                        async for out in outputs:
                            timer.on_tokens(len(out.new_token_ids))
                except RequestError as exc:
                    self.metrics.refused.labels(reason=RefusalReason.INVALID_ARGUMENT).inc()
                    await _refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc), param=exc.param)
                except RequestFailed as exc:
                    timer.on_finish(FinishReason.ERROR)
                    await _refuse(context, grpc.StatusCode.INTERNAL, f"the engine failed this request: {exc}",
                                  REQUEST_FAILED)
                except EngineDeadError as exc:
                    await _refuse(context, grpc.StatusCode.UNAVAILABLE, f"this worker's engine has stopped: {exc}",
                                  ENGINE_DEAD)
                timer.on_finish(out.finish_reason or FinishReason.PREFILLED)
                log.info("prefill done", extra={"finish_reason": out.finish_reason,
                                                "prompt_tokens": len(ids), "ttft_s": timer.ttft_s,
                                                "cached_tokens": out.num_cached_tokens})
                record = self.recall.start(request_id, request_digest(prompt, request.sampling), list(out.new_token_ids))
                record.finish_reason, record.stop_reason = out.finish_reason or "", out.stop_reason
                self.recall.end(request_id, record)
                return prefill_response(out, ids, self.node, self.engine.info.block_size)

    async def PullKV(self, request: pb.PullKVRequest, context):
        span = None
        if self.tracing.enabled:           # a child of the decode worker's kv_pull (none without one)
            parent = self.tracing.extract(context.invocation_metadata() or ())
            if parent is not None:
                span = self.tracing.start("mindmotor.worker.kv_read", parent, attributes={
                    "mindmotor.kv_handle": request.handle, "mindmotor.skip_blocks": request.skip_blocks})
        try:
            try:
                chunks = await self.kv.read(request.handle, request.skip_blocks, request.blocks_per_chunk)
            except KeyError:
                await context.abort(grpc.StatusCode.NOT_FOUND,
                                    f"no pinned KV under handle {request.handle!r} (released or expired)")
            for chunk in chunks:
                await context.write(chunk)
        finally:
            if span is not None:
                span.end()

    async def ReleaseKV(self, request: pb.ReleaseKVRequest, context) -> pb.ReleaseKVResponse:
        return pb.ReleaseKVResponse(found=await self.kv.release(request.handle))

    async def SetRole(self, request: pb.SetRoleRequest, context) -> pb.SetRoleResponse:
        try:
            role = Role.from_proto(request.role)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if role is None:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "role is required (ROLE_MIXED, ROLE_PREFILL or "
                                                                  "ROLE_DECODE)")
        previous, drained = await self.set_role(role, request.drain_timeout_s or None)
        return pb.SetRoleResponse(previous_role=previous.to_proto(), role=self.role.to_proto(), drained=drained)

    async def set_role(self, role: Role, drain_timeout_s: float | None = None) -> tuple[Role, bool]:
        previous, drained = await self.roles.switch(role, drain_timeout_s)
        if previous != role:
            self.metrics.role_switches.labels(role=role).inc()
        return previous, drained

    # ---- LoRA adapters --------------------------------------------------------------------------
    async def LoadLoraAdapter(self, request: pb.LoadLoraAdapterRequest, context) -> pb.LoraAdapters:
        """Read and check the adapter on a thread of its own: the engine's steps go on meanwhile (the
        adapters' table is locked for the registration alone, as for requests validated off the engine
        thread: engine/lora_slots.py)."""
        if not request.lora_name or not request.lora_path:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "lora_name and lora_path are required")
        if not self.engine.engine.config.enable_lora:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "LoRA adapters are not enabled on this worker (start it with --enable-lora)")
        try:
            await asyncio.to_thread(self.engine.engine.add_lora, request.lora_name, request.lora_path)
        except ValueError as exc:            # the adapter's reason (model.lora.AdapterError)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"cannot serve LoRA adapter "
                                                                  f"{request.lora_name!r}: {exc}")
        log.info("LoRA adapter loaded", extra={"lora_name": request.lora_name, "lora_path": request.lora_path})
        return await self.lora_adapters()

    async def UnloadLoraAdapter(self, request: pb.UnloadLoraAdapterRequest, context) -> pb.LoraAdapters:
        if not await self.engine.run_on_engine(lambda e: e.remove_lora(request.lora_name)):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no LoRA adapter named {request.lora_name!r}")
        log.info("LoRA adapter unloaded", extra={"lora_name": request.lora_name})
        return await self.lora_adapters()

    async def ListLoraAdapters(self, request: pb.ListLoraAdaptersRequest, context) -> pb.LoraAdapters:
        return await self.lora_adapters()

    async def lora_adapters(self) -> pb.LoraAdapters:
        return await self.engine.run_on_engine(lora_listing)

    async def Drain(self, request: pb.DrainRequest, context) -> pb.DrainResponse:
        await self.admission.start_drain()
        if request.wait:
            await self.admission.wait_idle(request.timeout_s or None)
        in_flight = len(self.admission.in_flight)
        return pb.DrainResponse(in_flight=in_flight, drained=in_flight == 0)


def lora_listing(engine) -> pb.LoraAdapters:
    """The engine's adapters as the proto (on the engine thread)."""
    slots = engine.lora
    if slots is None:
        return pb.LoraAdapters(enabled=False)
    info = slots.info(engine.scheduler.block_holders(), engine.scheduler.waiting)
    resident = {s.record.name for s in slots.slots if s.record is not None}
    adapters = []
    for name, path in sorted(slots.known.items()):
        record = slots.host.get(name)
        adapters.append(pb.LoraAdapter(name=name, path=path, rank=record.rank if record else 0,
                                       resident=name in resident, requests=slots.requests.get(name, 0)))
    return pb.LoraAdapters(enabled=True, adapters=adapters, max_loras=slots.max_loras,
                           max_lora_rank=slots.max_rank, running=info["running_lora_adapters"],
                           waiting=info["waiting_lora_adapters"])


async def _refuse(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str,
                  failure: str | None = None, param: str | None = None) -> NoReturn:
    """End the call with `code` (raises); the log line carries the request id. `failure` and
    `param`: the `mindmotor-failure` and `mindmotor-param` trailing metadata (protocol/failure.py)."""
    log.info("request refused", extra={"code": code.name, "reason": message})
    metadata = ((FAILURE_METADATA_KEY, failure),) if failure else ()
    metadata += ((PARAM_METADATA_KEY, param),) if param else ()
    await context.abort(code, message, trailing_metadata=metadata)
