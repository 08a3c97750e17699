"""SetTraffic: deployment traffic weights stored by the controller and carried by its routing
table (filtered by model like the instances), guarded by the admin token, kept across a restart
with Redis."""

from __future__ import annotations

import grpc
import pytest

from secrets_registry import given_secret
from mindmotor.common.admin_token import bearer_metadata
from mindmotor.common.ports import free_port
from mindmotor.protocol import controller_pb2, controller_pb2_grpc

pytestmark = pytest.mark.asyncio
TOKEN = given_secret("controller-admin-token")


async def set_traffic(address: str, deployment: str, model: str, weights: dict, token: str | None = TOKEN):
    async with grpc.aio.insecure_channel(address) as channel:
        return await controller_pb2_grpc.ControllerStub(channel).SetTraffic(
            controller_pb2.SetTrafficRequest(deployment=deployment, model=model, weights=weights),
            metadata=bearer_metadata(token), timeout=5)


def splits(table: controller_pb2.RoutingTable) -> dict[str, tuple[str, dict]]:
    return {t.deployment: (t.model, dict(t.weights)) for t in table.traffic}


async def test_weights_reach_every_watcher_and_follow_the_model_filter(spawn_controller, make_watcher):
    ctrl = spawn_controller(admin_token=TOKEN)
    everything = await make_watcher(ctrl.address)
    only_a = await make_watcher(ctrl.address, model="model-a")

    first = await set_traffic(ctrl.address, "dep-a", "model-a", {"v1": 90, "v2": 10})
    await set_traffic(ctrl.address, "dep-b", "model-b", {"v1": 1})
    table = await everything.wait_for(lambda t: len(t.traffic) == 2, timeout=5)
    assert splits(table) == {"dep-a": ("model-a", {"v1": 90, "v2": 10}), "dep-b": ("model-b", {"v1": 1})}
    assert table.version >= first.version
    filtered = await only_a.wait_for(lambda t: len(t.traffic) == 1, timeout=5)
    assert splits(filtered) == {"dep-a": ("model-a", {"v1": 90, "v2": 10})}

    await set_traffic(ctrl.address, "dep-a", "", {})                     # no weights: cleared
    table = await everything.wait_for(lambda t: len(t.traffic) == 1, timeout=5)
    assert list(splits(table)) == ["dep-b"]


async def test_refusals(spawn_controller):
    ctrl = spawn_controller(admin_token=TOKEN)
    for token, weights, model, code, message in [
        (None, {"v1": 1}, "m", grpc.StatusCode.UNAUTHENTICATED, "admin token"),
        ("wrong", {"v1": 1}, "m", grpc.StatusCode.UNAUTHENTICATED, "admin token"),
        (TOKEN, {"v1": -1}, "m", grpc.StatusCode.INVALID_ARGUMENT, "negative for v1"),
        (TOKEN, {"v1": 0}, "m", grpc.StatusCode.INVALID_ARGUMENT, "at least one weight must be positive"),
        (TOKEN, {"v1": 1}, "", grpc.StatusCode.INVALID_ARGUMENT, "model is required"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await set_traffic(ctrl.address, "dep", model, weights, token=token)
        assert refused.value.code() == code and message in refused.value.details()


async def test_weights_survive_a_restart_with_redis(spawn_controller, make_watcher, redis_prefix):
    port = free_port()
    ctrl = spawn_controller(port=port, redis_prefix=redis_prefix)
    await set_traffic(ctrl.address, "dep", "m", {"v1": 3, "v2": 1}, token=None)     # no token configured: open
    ctrl.kill()
    restarted = spawn_controller(port=port, redis_prefix=redis_prefix)
    watcher = await make_watcher(restarted.address)
    assert splits(watcher.table) == {"dep": ("m", {"v1": 3, "v2": 1})}
