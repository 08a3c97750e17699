"""vLLM's iteration_tokens_total travels worker → heartbeat → the controller's record → the routing
table's InstanceLoad → the coordinator's view, as the worker counted it."""

from __future__ import annotations

import asyncio

from mindmotor.common.store import MemoryStore
from mindmotor.common.vllm_metrics import ITERATION_TOKEN_BUCKETS
from mindmotor.controller.registry import Registry
from mindmotor.coordinator.routing.controller_source import view_from_info
from mindmotor.protocol import controller_pb2


def test_heartbeat_counts_reach_the_coordinators_view():
    counts = [0] * (len(ITERATION_TOKEN_BUCKETS) + 1)
    counts[0], counts[5], counts[-1] = 7, 2, 1

    async def scenario():
        registry = Registry(MemoryStore(prefix="t:"), clock=lambda: 1000.0)
        await registry.register(controller_pb2.RegisterRequest(instance_id="w", address="h:1", model="m"))
        await registry.heartbeat(controller_pb2.HeartbeatRequest(
            instance_id="w", state="serving", iteration_token_counts=counts, iteration_tokens_sum=20000.5), None)
        return (await registry.get("w")).to_info()

    view = view_from_info(asyncio.run(scenario()))
    assert view.iteration_token_counts == tuple(counts) and view.iteration_tokens_sum == 20000.5
