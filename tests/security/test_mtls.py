"""Service-to-service authentication under mutual TLS, on a real cluster (controller, worker,
deployer, coordinator as processes, certificates from `ensure_cluster_pki`): every gRPC port
speaks only TLS; a caller without a certificate from the cluster CA (none, another CA's, an
expired one) does not get past the handshake; a certificate of the wrong role is refused
PERMISSION_DENIED and counted; a live instance id cannot be registered by anyone else. After each
refusal the platform serves as before."""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mindmotor.common import rpc
from mindmotor.common.roles import Role
from mindmotor.protocol import controller_pb2, controller_pb2_grpc, deployer_pb2, deployer_pb2_grpc
from mindmotor.protocol import worker_pb2, worker_pb2_grpc

from .conftest import WORKER_ID, code_of, metric, tls

GENERATE = worker_pb2.GenerateRequest(prompt_text="hello", sampling=worker_pb2.SamplingParams(max_tokens=4))


def ports(cluster) -> dict[str, str]:
    return {"controller": cluster.controller, "worker": cluster.worker, "deployer": cluster.deployer}


def test_every_grpc_port_speaks_only_tls(mtls_cluster, pki):
    ca = pki["controller"].ca
    for service, address in ports(mtls_cluster).items():
        host, port = address.rsplit(":", 1)
        with grpc.insecure_channel(address) as plain:            # plain-text HTTP/2: no answer
            assert code_of(lambda: health_pb2_grpc.HealthStub(plain).Check(
                health_pb2.HealthCheckRequest(), timeout=3)) == grpc.StatusCode.UNAVAILABLE, service
        context = ssl.create_default_context(cafile=str(ca))     # the handshake, by the standard library
        context.load_cert_chain(str(pki["admin"].cert), str(pki["admin"].key))
        context.set_alpn_protocols(["h2"])
        with socket.create_connection((host, int(port)), timeout=5) as raw, \
                context.wrap_socket(raw, server_hostname=host) as conn:
            assert conn.version() in ("TLSv1.2", "TLSv1.3")
            sans = dict((kind, value) for kind, value in conn.getpeercert()["subjectAltName"] if kind == "URI")
            assert sans["URI"] == f"mindmotor://{service}/{WORKER_ID if service == 'worker' else service}"
        with rpc.channel(address, sec=tls(pki["admin"], ca)) as channel:   # health checks stay open to members
            assert health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status \
                == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("credential", ["none", "foreign", "expired"])
def test_callers_without_a_valid_cluster_certificate_get_nothing(mtls_cluster, pki, credential):
    ca = pki["controller"].ca
    sec = tls(None if credential == "none" else pki[credential], ca)
    with rpc.channel(mtls_cluster.worker, sec=sec) as channel:
        worker = worker_pb2_grpc.WorkerStub(channel)
        for call in (lambda: worker.Drain(worker_pb2.DrainRequest(), timeout=5),
                     lambda: worker.SetRole(worker_pb2.SetRoleRequest(role=Role.PREFILL.to_proto()), timeout=5),
                     lambda: worker.Generate(GENERATE, timeout=5)):
            assert code_of(call) == grpc.StatusCode.UNAVAILABLE       # refused in the TLS handshake
    with rpc.channel(mtls_cluster.controller, sec=sec) as channel:
        controller = controller_pb2_grpc.ControllerStub(channel)
        assert code_of(lambda: controller.Deregister(controller_pb2.DeregisterRequest(instance_id=WORKER_ID),
                                                     timeout=5)) == grpc.StatusCode.UNAVAILABLE
    admin = tls(pki["admin"], ca)
    status = mtls_cluster.worker_status(admin)
    assert (status.state, status.role) == ("serving", Role.MIXED.to_proto())
    assert mtls_cluster.routed_address(tls(pki["coordinator"], ca)) == mtls_cluster.worker
    assert mtls_cluster.complete()["choices"][0]["text"] is not None


def test_the_wrong_role_is_refused_and_counted(mtls_cluster, pki):
    ca = pki["controller"].ca
    before = metric(mtls_cluster.worker_metrics, "mindmotor_rpc_refused_total", mtls_cluster.verify,
                    code="PERMISSION_DENIED")
    coordinator = tls(pki["coordinator"], ca)
    with rpc.channel(mtls_cluster.worker, sec=coordinator) as channel:
        worker = worker_pb2_grpc.WorkerStub(channel)
        for call in (lambda: worker.Drain(worker_pb2.DrainRequest(), timeout=5),
                     lambda: worker.SetRole(worker_pb2.SetRoleRequest(role=Role.PREFILL.to_proto()), timeout=5)):
            try:
                call()
                raise AssertionError("a coordinator drained or switched a worker")
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "coordinator" in exc.details() and "allowed" in exc.details()
        assert len(list(worker.Generate(GENERATE, timeout=10))) > 0          # what coordinators are for
    with rpc.channel(mtls_cluster.controller, sec=coordinator) as channel:
        assert code_of(lambda: controller_pb2_grpc.ControllerStub(channel).Register(controller_pb2.RegisterRequest(
            instance_id="fake", address="127.0.0.1:1", model="tiny"), timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    with rpc.channel(mtls_cluster.controller, sec=tls(pki["worker"], ca)) as channel:
        assert code_of(lambda: controller_pb2_grpc.ControllerStub(channel).SetTraffic(
            controller_pb2.SetTrafficRequest(deployment="d", model="tiny", weights={"v1": 1}), timeout=5)) \
            == grpc.StatusCode.PERMISSION_DENIED
    for who, expected in (("coordinator", grpc.StatusCode.PERMISSION_DENIED), ("admin", None)):
        with rpc.channel(mtls_cluster.deployer, sec=tls(pki[who], ca)) as channel:
            assert code_of(lambda: deployer_pb2_grpc.DeployerStub(channel).List(
                deployer_pb2.ListDeploymentsRequest(), timeout=5)) == expected, who
    after = metric(mtls_cluster.worker_metrics, "mindmotor_rpc_refused_total", mtls_cluster.verify,
                    code="PERMISSION_DENIED")
    assert after - before == 2
    status = mtls_cluster.worker_status(tls(pki["admin"], ca))
    assert (status.state, status.role) == ("serving", Role.MIXED.to_proto())


class FakeWorker(worker_pb2_grpc.WorkerServicer):
    """The attacker's server: would collect the prompts sent to it."""

    def __init__(self):
        self.prompts: list[str] = []

    def Generate(self, request, context):
        self.prompts.append(request.prompt_text)
        return iter(())


def test_a_live_instance_cannot_be_hijacked(mtls_cluster, pki):
    """Issue 10: Register(worker-0-0, <my server>) + a heartbeat replaced the real worker's address,
    and the next requests (with their prompts) went to the fake. Now every step is refused."""
    from concurrent import futures

    ca = pki["controller"].ca
    fake = FakeWorker()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    worker_pb2_grpc.add_WorkerServicer_to_server(fake, server)
    fake_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    admin_metrics = f"{mtls_cluster.controller_admin}/metrics"
    before = metric(admin_metrics, "mindmotor_controller_registrations_refused_total", mtls_cluster.verify)
    hijack = controller_pb2.RegisterRequest(instance_id=WORKER_ID, address=f"127.0.0.1:{fake_port}", model="tiny")
    try:
        # another worker's certificate (not its instance), and the worker's own (not its address)
        for name, reason in (("other-worker", "only register its own instance"), ("worker", "live")):
            with rpc.channel(mtls_cluster.controller, sec=tls(pki[name], ca)) as channel:
                stub = controller_pb2_grpc.ControllerStub(channel)
                with pytest.raises(grpc.RpcError) as refused:
                    stub.Register(hijack, timeout=5)
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert reason in refused.value.details()
        with rpc.channel(mtls_cluster.controller, sec=tls(pki["other-worker"], ca)) as channel:
            stub = controller_pb2_grpc.ControllerStub(channel)
            beats = stub.Heartbeat(iter([controller_pb2.HeartbeatRequest(instance_id=WORKER_ID, state="draining")]),
                                   timeout=5)
            assert code_of(lambda: beats) == grpc.StatusCode.PERMISSION_DENIED
            assert code_of(lambda: stub.Deregister(controller_pb2.DeregisterRequest(instance_id=WORKER_ID),
                                                   timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
        refusals = metric(admin_metrics, "mindmotor_controller_registrations_refused_total", mtls_cluster.verify)
        assert refusals - before == 4
        assert mtls_cluster.routed_address(tls(pki["coordinator"], ca)) == mtls_cluster.worker
        for i in range(6):
            mtls_cluster.complete(f"secret prompt {i}")
        assert fake.prompts == []
        status = mtls_cluster.worker_status(tls(pki["admin"], ca))
        assert status.state == "serving"
    finally:
        server.stop(None)


def test_the_operator_tools_take_an_admin_certificate(mtls_cluster, pki):
    admin = pki["admin"]
    flags = ["--tls-ca", str(admin.ca), "--tls-cert", str(admin.cert), "--tls-key", str(admin.key)]
    run = [sys.executable, "-m", "mindmotor.cli"]
    smi = subprocess.run([*run, "npu-smi", "--worker", mtls_cluster.worker, *flags],
                         capture_output=True, text=True, timeout=60)
    assert smi.returncode == 0, smi.stderr
    assert "910B3" in smi.stdout
    listed = subprocess.run([*run, "deploy", "list", "--deployer", mtls_cluster.deployer, *flags],
                            capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    plaintext = subprocess.run([*run, "deploy", "list", "--deployer", mtls_cluster.deployer],
                               capture_output=True, text=True, timeout=60)
    assert plaintext.returncode == 1 and "requires TLS client certificates" in plaintext.stderr
    assert "--tls-ca, --tls-cert and --tls-key" in plaintext.stderr
    without = subprocess.run([*run, "npu-smi", "--worker", mtls_cluster.worker, "--timeout", "3"],
                             capture_output=True, text=True, timeout=60)
    assert without.returncode == 1 and "UNAVAILABLE" in without.stderr
