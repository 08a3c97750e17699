"""`WorkerService`: the Worker RPCs (worker.proto) over one `AsyncLLMEngine`.

Generate streams one chunk per engine output. A request the engine refuses fails alone with
INVALID_ARGUMENT; a client that cancels or goes away cancels this handler's task, which closes
the engine stream, which aborts the request and frees its KV blocks.
"""

from __future__ import annotations

import logging
import uuid
from contextlib import aclosing
from typing import NoReturn

import grpc

from mindmotor.common.logging import request_context
from mindmotor.engine.async_engine import AsyncLLMEngine, EngineDeadError
from mindmotor.engine.llm_engine import RequestError
from mindmotor.engine.sampling_params import SamplingParams
from mindmotor.protocol import worker_pb2 as pb
from mindmotor.protocol import worker_pb2_grpc

from .admission import Admission
from .convert import (device_status_from_snapshot, load_from_stats, prompt_from_request,
                      response_from_output, sampling_params_from_proto)
from .metrics import WorkerMetrics

log = logging.getLogger("mindmotor.worker")

ROLE_MIXED = "mixed"


class WorkerService(worker_pb2_grpc.WorkerServicer):
    def __init__(self, engine: AsyncLLMEngine, admission: Admission, metrics: WorkerMetrics,
                 worker_id: str, role: str = ROLE_MIXED):
        self.engine = engine
        self.admission = admission
        self.metrics = metrics
        self.worker_id = worker_id
        self.role = role

    # ---- Generate ----------------------------------------------------------------------------
    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> None:
        request_id = request.request_id or uuid.uuid4().hex
        with request_context(request_id):
            if not self.admission.accepting:
                await _refuse(context, grpc.StatusCode.UNAVAILABLE,
                              "the worker is draining and takes no new requests; send it elsewhere")
            if request_id in self.admission.in_flight:
                await _refuse(context, grpc.StatusCode.ALREADY_EXISTS,
                              f"request id {request_id!r} is already in use")
            try:
                prompt = prompt_from_request(request)
                params = sampling_params_from_proto(request.sampling)
            except ValueError as exc:
                await _refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            with self.admission.track(request_id):
                await self._stream(request_id, prompt, params, request.priority, context)

    async def _stream(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                      priority: int, context: grpc.aio.ServicerContext) -> None:
        timer = self.metrics.request_timer()
        finish_reason = "cancelled"          # unless the engine finishes it: the client went away
        try:
            async with aclosing(self.engine.generate(request_id, prompt, params, priority)) as outputs:
                async for out in outputs:
                    timer.on_tokens(len(out.new_token_ids))
                    await context.write(response_from_output(out))
                    if out.finished:
                        finish_reason = out.finish_reason
                        log.info("request finished", extra={
                            "finish_reason": finish_reason, "prompt_tokens": out.num_prompt_tokens,
                            "completion_tokens": out.num_output_tokens,
                            "cached_tokens": out.num_cached_tokens, "ttft_s": timer.ttft_s,
                            "duration_s": timer.elapsed_s})
        except RequestError as exc:
            finish_reason = None
            await _refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except EngineDeadError as exc:
            finish_reason = "error"
            log.error("the engine is dead", extra={"error": str(exc)})
            await context.abort(grpc.StatusCode.INTERNAL, str(exc))
        finally:
            if finish_reason is not None:
                timer.on_finish(finish_reason)
            if finish_reason == "cancelled":
                log.info("request cancelled by the client; aborted", extra={"duration_s": timer.elapsed_s})

    # ---- Abort, Status, Drain ----------------------------------------------------------------
    async def Abort(self, request: pb.AbortRequest, context) -> pb.AbortResponse:
        found = request.request_id in self.admission.in_flight
        if found:
            self.engine.abort(request.request_id)
            with request_context(request.request_id):
                log.info("request aborted by Abort")
        return pb.AbortResponse(found=found)

    async def Status(self, request: pb.StatusRequest, context) -> pb.StatusResponse:
        return self.status()

    def status(self) -> pb.StatusResponse:
        engine = self.engine.engine
        return pb.StatusResponse(
            worker_id=self.worker_id, model=engine.model_name, max_model_len=engine.max_model_len,
            block_size=engine.config.block_size, role=self.role, state=self.admission.state,
            load=load_from_stats(self.engine.stats(), len(self.admission.in_flight)),
            device=device_status_from_snapshot(self.engine.device_snapshot()),
            emulated_profile=engine.device.profile.name, timing=engine.config.timing)

    async def Drain(self, request: pb.DrainRequest, context) -> pb.DrainResponse:
        await self.admission.start_drain()
        if request.wait:
            await self.admission.wait_idle(request.timeout_s or None)
        in_flight = len(self.admission.in_flight)
        return pb.DrainResponse(in_flight=in_flight, drained=in_flight == 0)


async def _refuse(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    """End the call with `code` (raises); the log line carries the request id."""
    log.info("request refused", extra={"code": code.name, "reason": message})
    await context.abort(code, message)
