"""A real controller process (in-memory store) with fake instances: the health state machine,
the Watch stream, failure reports and commands, seen through the routing table."""

from __future__ import annotations

import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mindmotor.common.roles import Role
from mindmotor.protocol import controller_pb2, controller_pb2_grpc

from service_processes import DEAD_S, SUSPECT_S

from .conftest import eventually, state_of

pytestmark = pytest.mark.asyncio
SLACK = 2.0   # scheduling slack on a busy 2-core machine


async def test_ready_suspect_dead_and_recovery(spawn_controller, make_instance, make_watcher):
    ctrl = spawn_controller()
    watcher = await make_watcher(ctrl.address)
    a = await make_instance(ctrl.address, "a")
    b = await make_instance(ctrl.address, "b")
    await watcher.wait_for(lambda t: state_of(t, "a") == state_of(t, "b") == "ready", timeout=5)

    # a stops heartbeating (stream open): suspect after ~0.6 s, back to ready when it resumes
    a.agent.pause()
    paused = time.monotonic()
    table = await watcher.wait_for(lambda t: state_of(t, "a") == "suspect", timeout=SUSPECT_S + SLACK)
    assert time.monotonic() - paused >= SUSPECT_S * 0.9
    assert not next(i for i in table.instances if i.instance_id == "a").routable
    assert state_of(table, "b") == "ready"
    a.agent.resume()
    await watcher.wait_for(lambda t: state_of(t, "a") == "ready", timeout=2)

    # b goes silent for good (the process "crashed"): suspect, then dead — out of the table
    await b.agent.stop(deregister=False)
    silent = time.monotonic()
    await watcher.wait_for(lambda t: state_of(t, "b") == "suspect", timeout=SUSPECT_S + SLACK)
    table = await watcher.wait_for(lambda t: state_of(t, "b") is None, timeout=DEAD_S + SLACK)
    assert time.monotonic() - silent >= DEAD_S * 0.9
    assert state_of(table, "a") == "ready"
    assert ctrl.instances()["b"]["state"] == "dead"


async def test_dead_instance_is_told_to_reregister(spawn_controller, make_instance, make_watcher):
    ctrl = spawn_controller()
    watcher = await make_watcher(ctrl.address)
    a = await make_instance(ctrl.address, "a")
    a.agent.pause()
    await watcher.wait_for(lambda t: state_of(t, "a") is None and t.version >= 3, timeout=DEAD_S + SLACK)
    sessions = a.agent.sessions
    a.agent.resume()                        # the heartbeat is answered with "re-register"
    await watcher.wait_for(lambda t: state_of(t, "a") == "ready", timeout=3)
    assert a.agent.sessions == sessions + 1


async def test_watch_streams_a_new_version_on_every_change(spawn_controller, make_instance, make_watcher):
    ctrl = spawn_controller()
    watcher = await make_watcher(ctrl.address)
    first = watcher.table
    assert first.instances == [] and first.from_leader

    await make_instance(ctrl.address, "a", model="m1", deployment="d", version="v2", weight=3)
    registered = await watcher.wait_for(lambda t: state_of(t, "a") is not None, timeout=3)
    assert registered.version > first.version
    ready = await watcher.wait_for(lambda t: state_of(t, "a") == "ready", timeout=3)
    assert ready.version > registered.version or state_of(registered, "a") == "ready"
    info = ready.instances[0]
    assert (info.model, info.deployment, info.version, info.weight, info.role, info.block_size) == \
        ("m1", "d", "v2", 3.0, Role.MIXED.to_proto(), 16)

    b = await make_instance(ctrl.address, "b", model="m2")
    filtered = await make_watcher(ctrl.address, model="m2")
    await filtered.wait_for(lambda t: [i.instance_id for i in t.instances] == ["b"], timeout=3)

    before = watcher.version
    await b.agent.stop(deregister=True)     # a clean shutdown: gone at once, not after a timeout
    table = await watcher.wait_for(lambda t: state_of(t, "b") is None, timeout=1)
    assert table.version > before
    assert "b" not in ctrl.instances()


async def test_load_and_cached_blocks_reach_the_table(spawn_controller, make_instance, make_watcher):
    ctrl = spawn_controller()
    watcher = await make_watcher(ctrl.address)
    a = await make_instance(ctrl.address, "a")
    a.load.running, a.load.waiting, a.load.kv_usage, a.load.outstanding_tokens = 3, 2, 0.5, 1234
    a.load.cached_block_hashes = [bytes([i]) * 16 for i in range(4)]
    a.agent.heartbeat_now()
    table = await watcher.wait_for(lambda t: t.instances and t.instances[0].load.outstanding_tokens == 1234, 3)
    info = table.instances[0]
    assert (info.load.running, info.load.waiting, info.load.kv_usage) == (3, 2, 0.5)
    assert list(info.cached_block_hashes) == [bytes([i]) * 16 for i in range(4)]
    assert ctrl.instances()["a"]["cached_blocks"] == 4


async def test_report_failure_marks_suspect_then_heartbeats_restore(spawn_controller, make_instance, make_watcher):
    ctrl = spawn_controller()
    watcher = await make_watcher(ctrl.address)
    await make_instance(ctrl.address, "a")
    await watcher.wait_for(lambda t: state_of(t, "a") == "ready", timeout=3)

    reported = time.monotonic()
    assert await watcher.report_failure("a", "connection refused", reporter="coord-1") is True
    record = ctrl.instances()["a"]
    assert record["state"] == "suspect" and "connection refused" in record["reason"] and record["failures"] == 1
    await watcher.wait_for(lambda t: state_of(t, "a") == "suspect", timeout=1)
    # heartbeats continue: held suspect for the suspect timeout, then ready again
    await watcher.wait_for(lambda t: state_of(t, "a") == "ready", timeout=SUSPECT_S + SLACK)
    assert time.monotonic() - reported >= SUSPECT_S * 0.9
    assert await watcher.report_failure("nope", "x") is False


async def test_drain_and_set_role_commands(spawn_controller, make_instance, make_watcher):
    ctrl = spawn_controller()
    watcher = await make_watcher(ctrl.address)
    a = await make_instance(ctrl.address, "a")
    await watcher.wait_for(lambda t: state_of(t, "a") == "ready", timeout=3)

    response = ctrl.post("/v1/instances/a/role", {"role": "prefill"})
    assert response.status_code == 200
    table = await watcher.wait_for(lambda t: t.instances and t.instances[0].role == Role.PREFILL.to_proto(), timeout=3)
    assert a.roles == ["prefill"] and table.instances[0].routable

    response = ctrl.post("/v1/instances/a/drain", {"reason": "rollout"})
    assert response.status_code == 200 and response.json()["state"] == "draining"
    await watcher.wait_for(lambda t: state_of(t, "a") == "draining", timeout=1)
    await eventually(lambda: a.drains == ["rollout"], timeout=3)
    await eventually(lambda: ctrl.instances()["a"]["reported_state"] == "draining", timeout=3)
    assert state_of(watcher.table, "a") == "draining"

    bad = ctrl.post("/v1/instances/a/role", {"role": "teacher"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "role"


async def test_grpc_contract_edges(spawn_controller):
    ctrl = spawn_controller()
    async with grpc.aio.insecure_channel(ctrl.address) as channel:
        health = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="mindmotor.v1.Controller"))
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        stub = controller_pb2_grpc.ControllerStub(channel)
        registered = await stub.Register(controller_pb2.RegisterRequest(instance_id="x", address="h:1", model="m"))
        assert registered.accepted and registered.state == "starting"
        assert (registered.heartbeat_interval_s, registered.suspect_after_s, registered.dead_after_s) == \
            pytest.approx((0.2, 0.6, 1.5))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Register(controller_pb2.RegisterRequest(instance_id="x", address="h:1", model="m",
                                                               role=99))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "role" in err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Register(controller_pb2.RegisterRequest(instance_id="x", model="m"))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "address" in err.value.details()

        # a heartbeat from an unknown instance is answered with "re-register"
        call = stub.Heartbeat()
        await call.write(controller_pb2.HeartbeatRequest(instance_id="ghost"))
        command = await call.read()
        assert command.WhichOneof("command") == "reregister"
        call.cancel()

        response = await stub.Deregister(controller_pb2.DeregisterRequest(instance_id="ghost"))
        assert response.found is False
