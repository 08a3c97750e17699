"""`DeployerService`: the gRPC `mindmotor.v1.Deployer` servicer — thin handlers over `Deployments`
(the calls' meaning) and the reconciler's last view (each version's status). Refusals map to
status codes: a standby deployer → UNAVAILABLE, InvalidArgument/SpecError → INVALID_ARGUMENT, NotFound → NOT_FOUND,
FailedPrecondition → FAILED_PRECONDITION, a store that does not answer → UNAVAILABLE, a record
that kept changing under the call → ABORTED (retry). The admin
token (or an admin certificate) is checked before any handler runs (`common.rpc.AuthInterceptor`)."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import Callable

import grpc

from mindmotor.common.store import StoreUnavailable
from mindmotor.protocol import deployer_pb2 as pb
from mindmotor.protocol import deployer_pb2_grpc

from .convert import record_to_proto, spec_from_proto
from .operations import Deployments, FailedPrecondition, InvalidArgument, NotFound
from .reconcile import Reconciler
from .records import DeploymentRecord
from .spec import SpecError
from .store import StoreConflict

log = logging.getLogger("mindmotor.deployer")

class NotOwner(Exception):
    """This deployer is a standby: another one holds the owner lease and acts on the deployments."""


STATUS_CODES = ((NotOwner, grpc.StatusCode.UNAVAILABLE), (SpecError, grpc.StatusCode.INVALID_ARGUMENT), (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
                (NotFound, grpc.StatusCode.NOT_FOUND), (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
                (StoreUnavailable, grpc.StatusCode.UNAVAILABLE), (StoreConflict, grpc.StatusCode.ABORTED))


@asynccontextmanager
async def refusals(context, call: str, deployment: str, owner: bool):
    """Abort the call with the status code of a refusal (logged with the deployment); a standby
    (not `owner`) refuses every call: its view of the replicas is not the owner's."""
    try:
        if not owner:
            raise NotOwner("this deployer is a standby: another deployer holds the owner lease and acts on "
                           "the deployments; call that one")
        yield
    except tuple(cls for cls, _ in STATUS_CODES) as exc:
        code = next(code for cls, code in STATUS_CODES if isinstance(exc, cls))
        log.info("call refused", extra={"call": call, "deployment": deployment, "code": code.name, "error": str(exc)})
        await context.abort(code, str(exc))


class DeployerService(deployer_pb2_grpc.DeployerServicer):
    def __init__(self, deployments: Deployments, reconciler: Reconciler, owner: Callable[[], bool] = lambda: True):
        self.deployments = deployments
        self.reconciler = reconciler
        self.owner = owner

    def _message(self, record: DeploymentRecord) -> pb.Deployment:
        return record_to_proto(record, self.reconciler.status.get(record.name, []),
                               self.reconciler.figures.get(record.name, ""))

    async def Apply(self, request, context):
        async with refusals(context, "Apply", request.spec.name, self.owner()):
            record = await self.deployments.apply(spec_from_proto(request.spec),
                                                  allow_tokenizer_change=request.allow_tokenizer_change)
        log.info("deployment applied", extra={"deployment": record.name, "generation": record.generation,
                                              "replicas": record.targets(), "traffic": record.spec.traffic})
        return self._message(record)

    async def Get(self, request, context):
        async with refusals(context, "Get", request.name, self.owner()):
            return self._message(await self.deployments.get(request.name))

    async def List(self, request, context):
        async with refusals(context, "List", "", self.owner()):
            records = await self.deployments.list()
        return pb.ListDeploymentsResponse(deployments=[self._message(r) for r in records])

    async def Delete(self, request, context):
        async with refusals(context, "Delete", request.name, self.owner()):
            record = await self.deployments.delete(request.name)
        log.info("deployment deleting", extra={"deployment": record.name})
        return self._message(record)

    async def SetTraffic(self, request, context):
        async with refusals(context, "SetTraffic", request.name, self.owner()):
            record = await self.deployments.set_traffic(request.name, dict(request.weights), adapter=request.adapter)
        log.info("traffic set", extra={"deployment": record.name, "traffic": record.spec.traffic,
                                       "adapter_traffic": record.spec.adapter_traffic})
        return self._message(record)

    async def Rollout(self, request, context):
        async with refusals(context, "Rollout", request.name, self.owner()):
            record = await self.deployments.rollout(
                request.name, request.version, request.checkpoint, request.canary, replicas=request.replicas,
                previous=request.previous, ready_timeout_s=request.ready_timeout_s,
                allow_tokenizer_change=request.allow_tokenizer_change, analysis=_analysis_overrides(request.analysis),
                disable_analysis=request.disable_analysis, adapter=request.adapter, adapter_path=request.adapter_path)
        log.info("rollout started", extra={"deployment": record.name, "version": request.version,
                                           "previous": record.rollout.previous, "canary": request.canary,
                                           "deadline": record.rollout.deadline, "analysis": record.rollout.analysis,
                                           "tokenizer_change": record.rollout.tokenizer_change,
                                           "adapter": record.rollout.adapter})
        return self._message(record)

    async def Promote(self, request, context):
        async with refusals(context, "Promote", request.name, self.owner()):
            record = await self.deployments.promote(request.name)
        log.info("rollout promoted", extra={"deployment": record.name, "version": record.rollout.version,
                                            "traffic": record.spec.traffic})
        return self._message(record)

    async def Rollback(self, request, context):
        async with refusals(context, "Rollback", request.name, self.owner()):
            record = await self.deployments.roll_back(request.name, request.reason)
        log.info("rollout rolled back", extra={"deployment": record.name, "version": record.rollout.version,
                                               "reason": record.rollout.reason, "traffic": record.spec.traffic})
        return self._message(record)


def _analysis_overrides(message: pb.RolloutAnalysis) -> dict:
    """The request's analysis settings (0: the deployer's default; `enabled` is not a setting)."""
    return {"max_error_rate_increase": message.max_error_rate_increase,
            "max_ttft_p90_increase": message.max_ttft_p90_increase, "window_s": message.window_s,
            "min_requests": message.min_requests}
