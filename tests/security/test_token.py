"""Service-to-service authentication with a cluster token (no TLS), on a real cluster: a call
without the token or with a wrong one is refused UNAUTHENTICATED and counted; a token holder
still cannot take over a live instance id from another address; a service bound beyond loopback
with no credential at all refuses to start. After each refusal the platform serves as before."""

from __future__ import annotations

import subprocess
import sys

import grpc
import pytest

from mindmotor.common import rpc
from mindmotor.common.roles import Role
from mindmotor.protocol import controller_pb2, controller_pb2_grpc, worker_pb2, worker_pb2_grpc

from .conftest import TOKEN, WORKER_ID, code_of, metric

GENERATE = worker_pb2.GenerateRequest(prompt_text="hello", sampling=worker_pb2.SamplingParams(max_tokens=4))


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_calls_without_the_cluster_token_are_refused(token_cluster, token):
    sec = rpc.RpcSecurity(token=token)
    before = metric(token_cluster.worker_metrics, "mindmotor_rpc_refused_total", code="UNAUTHENTICATED")
    with rpc.channel(token_cluster.worker, sec=sec) as channel:
        worker = worker_pb2_grpc.WorkerStub(channel)
        for call in (lambda: worker.Drain(worker_pb2.DrainRequest(), timeout=5),
                     lambda: worker.SetRole(worker_pb2.SetRoleRequest(role=Role.PREFILL.to_proto()), timeout=5),
                     lambda: worker.Generate(GENERATE, timeout=5),
                     lambda: worker.Status(worker_pb2.StatusRequest(), timeout=5)):
            try:
                result = call()
                list(result) if hasattr(result, "__next__") else None
                raise AssertionError("served without the cluster token")
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAUTHENTICATED
                assert "cluster token" in exc.details() and TOKEN not in exc.details()
    with rpc.channel(token_cluster.controller, sec=sec) as channel:
        controller = controller_pb2_grpc.ControllerStub(channel)
        assert code_of(lambda: controller.Deregister(controller_pb2.DeregisterRequest(instance_id=WORKER_ID),
                                                     timeout=5)) == grpc.StatusCode.UNAUTHENTICATED
    assert metric(token_cluster.worker_metrics, "mindmotor_rpc_refused_total", code="UNAUTHENTICATED") - before == 4
    member = rpc.RpcSecurity(token=TOKEN)
    status = token_cluster.worker_status(member)
    assert (status.state, status.role) == ("serving", Role.MIXED.to_proto())
    assert token_cluster.routed_address(member) == token_cluster.worker
    token_cluster.complete()


def test_a_token_holder_cannot_take_over_a_live_instance(token_cluster):
    member = rpc.RpcSecurity(token=TOKEN)
    with rpc.channel(token_cluster.controller, sec=member) as channel:
        stub = controller_pb2_grpc.ControllerStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            stub.Register(controller_pb2.RegisterRequest(instance_id=WORKER_ID, address="127.0.0.1:1", model="tiny"),
                          timeout=5)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert token_cluster.routed_address(member) == token_cluster.worker
    for i in range(3):
        token_cluster.complete(f"prompt {i}")


def test_a_service_without_credentials_beyond_loopback_refuses_to_start(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("MINDMOTOR_TLS", "MINDMOTOR_CLUSTER"))}
    done = subprocess.run([sys.executable, "-m", "mindmotor.cli", "controller", "--host", "0.0.0.0", "--port", "0",
                           "--admin-host", "127.0.0.1", "--admin-port", "0"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1
    assert "refusing to serve gRPC on 0.0.0.0" in done.stderr and "--cluster-token-file" in done.stderr
