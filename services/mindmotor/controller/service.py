"""`ControllerService`: the gRPC `mindmotor.v1.Controller` servicer — thin handlers over the
registry, the traffic table and the routing table broadcaster. A store that does not answer is
UNAVAILABLE (the caller retries, possibly on another controller)."""

from __future__ import annotations

import logging

import grpc

from mindmotor.common import rpc
from mindmotor.common.roles import Role
from mindmotor.common.store import StoreUnavailable
from mindmotor.vocabulary import HEARTBEAT_STATES
from mindmotor.protocol import controller_pb2, controller_pb2_grpc

from .config import ControllerConfig
from mindmotor.common.leader import LeaderElector
from .metrics import ControllerMetrics
from .records import validate_register
from .registry import Registry, RegistrationRefused
from .table_broadcaster import RoutingTableBroadcaster, for_model
from .traffic import TrafficTable, validate_traffic

log = logging.getLogger("mindmotor.controller")


def command_to_proto(command: dict) -> controller_pb2.HeartbeatCommand:
    if "drain" in command:
        return controller_pb2.HeartbeatCommand(drain=controller_pb2.DrainCommand(**command["drain"]))
    if "set_role" in command:
        role = Role.parse(command["set_role"]["role"])
        return controller_pb2.HeartbeatCommand(set_role=controller_pb2.SetRoleCommand(role=role.to_proto()))
    raise ValueError(f"unknown command {command!r}")


REREGISTER = controller_pb2.HeartbeatCommand(
    reregister=controller_pb2.ReregisterCommand(reason="unknown or dead instance; register again"))


class ControllerService(controller_pb2_grpc.ControllerServicer):
    def __init__(self, registry: Registry, broadcaster: RoutingTableBroadcaster, elector: LeaderElector,
                 metrics: ControllerMetrics, config: ControllerConfig, traffic: TrafficTable):
        self.registry = registry
        self.traffic = traffic
        self.broadcaster = broadcaster
        self.elector = elector
        self.metrics = metrics
        self.config = config
        self.accepting = True          # False once the controller shuts down

    async def _check_self(self, instance_id: str, context, action: str) -> None:
        """PERMISSION_DENIED unless a worker that proved who it is with a certificate acts on its
        own instance: the id is its certificate's name (`mindmotor://worker/<instance id>`).
        Operators (admin) act on any; token and open modes know workers by address only (the
        owner binding of `_check_owner`)."""
        caller = rpc.current_caller()
        if caller is None or caller.kind != "cert" or "worker" not in caller.roles or "admin" in caller.roles:
            return
        if instance_id != caller.name:
            self.metrics.registrations_refused.inc()
            log.warning(f"{action} refused", extra={"instance_id": instance_id, "caller": str(caller),
                                                    "reason": "not the caller's own instance"})
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"mindmotor://worker/{caller.name} may only {action} its own instance "
                                f"({caller.name}), not {instance_id}")

    async def _check_owner(self, instance_id: str, context, action: str) -> None:
        """PERMISSION_DENIED unless the caller is who registered the instance; an unknown
        instance passes (the handler says it is unknown)."""
        caller = rpc.current_caller()
        if caller is None:
            return
        try:
            record = await self.registry.get(instance_id)
        except StoreUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        if record is not None and record.owner and record.owner != caller.identity:
            self.metrics.registrations_refused.inc()
            log.warning(f"{action} refused", extra={"instance_id": instance_id, "caller": str(caller)})
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"instance {instance_id} was registered by another identity; {caller} may not {action} it")

    async def Register(self, request, context):
        problem = validate_register(request)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        response = controller_pb2.RegisterResponse(
            heartbeat_interval_s=self.config.heartbeat_interval_s, suspect_after_s=self.config.suspect_after_s,
            dead_after_s=self.config.dead_after_s, controller_id=self.config.controller_id)
        if not self.accepting:
            response.accepted, response.message = False, "controller is shutting down"
            return response
        await self._check_self(request.instance_id, context, "register")
        caller = rpc.current_caller()
        try:
            record = await self.registry.register(request, owner=caller.identity if caller else "")
        except StoreUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except RegistrationRefused as exc:
            self.metrics.registrations_refused.inc()
            log.warning("registration refused", extra={
                "instance_id": request.instance_id, "address": request.address,
                "caller": str(caller) if caller else "", "reason": "live instance of another identity or address"})
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        self.metrics.registrations.inc()
        log.info("instance registered", extra={
            "instance_id": record.instance_id, "address": record.address, "model": record.model,
            "role": record.role, "state": record.state})
        self.broadcaster.poke()
        response.accepted, response.state, response.message = True, record.state, "registered"
        return response

    async def Heartbeat(self, request_iterator, context):
        self.metrics.heartbeat_streams.inc()
        owned: set[str] = set()              # instance ids this stream's caller was checked to own
        try:
            async for beat in request_iterator:
                if not beat.instance_id:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "instance_id is required")
                if beat.instance_id not in owned:
                    await self._check_self(beat.instance_id, context, "heartbeat for")
                    await self._check_owner(beat.instance_id, context, "heartbeat for")
                    owned.add(beat.instance_id)
                if beat.state and beat.state not in HEARTBEAT_STATES:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                        f"state must be one of {', '.join(HEARTBEAT_STATES)}")
                try:
                    Role.from_proto(beat.role)
                except ValueError as exc:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                self.metrics.heartbeats.inc()
                hashes = list(beat.cached_blocks.hashes) if beat.HasField("cached_blocks") else None
                try:
                    outcome = await self.registry.heartbeat(beat, hashes)
                except StoreUnavailable as exc:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
                if not outcome.known:
                    yield REREGISTER
                    continue
                for command in outcome.commands:
                    log.info("command sent", extra={"instance_id": beat.instance_id, "command": command})
                    yield command_to_proto(command)
        finally:
            self.metrics.heartbeat_streams.dec()

    async def Watch(self, request, context):
        self.metrics.watchers.inc()
        try:
            async for table in self.broadcaster.updates():
                yield for_model(table, request.model)
        finally:
            self.metrics.watchers.dec()

    async def ReportFailure(self, request, context):
        self.metrics.failures_reported.inc()
        try:
            record = await self.registry.report_failure(request.instance_id, request.reason,
                                                        hold_s=self.config.suspect_after_s)
        except StoreUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        if record is None:
            return controller_pb2.ReportFailureResponse(found=False)
        log.warning("failure reported", extra={
            "instance_id": request.instance_id, "reason": request.reason, "reporter": request.reporter,
            "state": record.state})
        return controller_pb2.ReportFailureResponse(found=True, state=record.state)

    async def Deregister(self, request, context):
        await self._check_self(request.instance_id, context, "deregister")
        await self._check_owner(request.instance_id, context, "deregister")
        try:
            found = await self.registry.remove(request.instance_id)
        except StoreUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        if found:
            log.info("instance deregistered", extra={"instance_id": request.instance_id})
        return controller_pb2.DeregisterResponse(found=found)

    async def SetTraffic(self, request, context):
        # who may call it (deployer, admin: the admin token) is checked by common.rpc's interceptor
        problem = validate_traffic(request)
        if problem:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        try:
            version = await self.traffic.set(request.deployment, request.model, dict(request.weights),
                                             adapter=request.adapter)
        except StoreUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        log.info("traffic set", extra={"deployment": request.deployment, "model": request.model,
                                       "adapter": request.adapter, "weights": dict(request.weights),
                                       "routing_version": version})
        self.broadcaster.poke()
        return controller_pb2.SetTrafficResponse(version=version)
