"""One identity per worker (issue 19). Under a real deployer (the mutual-TLS test cluster's, local
backend) each replica presents its own `mindmotor://worker/<instance id>`, issued by the worker CA;
the controller binds each record to it. One replica's certificate — what an attacker who took it
holds — may act on its own record only: it cannot Deregister, Heartbeat for or re-Register another
worker's instance, nor Drain or SetRole another worker (before, every replica had the same
certificate, and one of them deregistered all the others). A non-worker identity from an
intermediate CA never gets in: from the worker CA the handshake refuses it (BoringSSL enforces the
URI name constraint), from an intermediate without that constraint the interceptor does."""

from __future__ import annotations

import datetime
import socket
import ssl
from pathlib import Path

import grpc
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from mindmotor.common import certs, rpc
from mindmotor.common.roles import Role
from mindmotor.common.waiting import wait_until
from mindmotor.deployer.client import DeployerClient
from mindmotor.deployer.spec import parse_spec
from mindmotor.protocol import controller_pb2, controller_pb2_grpc, worker_pb2, worker_pb2_grpc

from .conftest import WORKER_ID, code_of, tls

DEPLOYMENT, MODEL = "ident", "tiny-ident"
REPLICAS = [f"{DEPLOYMENT}-v1-0", f"{DEPLOYMENT}-v1-1"]


def instances(cluster) -> dict[str, dict]:
    response = httpx.get(f"{cluster.controller_admin}/v1/instances", verify=cluster.verify, timeout=5)
    response.raise_for_status()
    return {i["instance_id"]: i for i in response.json()["data"]}


@pytest.fixture(scope="module")
def deployed(mtls_cluster, pki, tiny_ckpt):
    """Two replicas of deployment `ident` started by the cluster's deployer; deleted afterwards."""
    client = DeployerClient(mtls_cluster.deployer, timeout_s=30, sec=tls(pki["admin"], pki["admin"].ca))
    client.apply(parse_spec({"name": DEPLOYMENT, "model": MODEL, "versions": [
        {"name": "v1", "replicas": 2, "checkpoint": str(tiny_ckpt), "worker": {"timing": "virtual"}}]}))
    try:
        yield wait_until(lambda: (found := {i: r for i, r in instances(mtls_cluster).items()
                                            if i in REPLICAS and r["state"] == "ready"}) and len(found) == 2 and found,
                         timeout=90, interval=0.2, what="both replicas ready in the controller")
    finally:
        client.delete(DEPLOYMENT)
        wait_until(lambda: not set(REPLICAS) & set(instances(mtls_cluster)), timeout=60, interval=0.2,
                   what="the replicas gone from the controller")
        client.close()


def replica_files(mtls_cluster, instance: str) -> certs.CertPaths:
    """Where the deployer wrote the replica's certificate (its log directory's certs/<instance>)."""
    base = mtls_cluster.replica_log_dir / "certs" / instance
    return certs.CertPaths(base / "cert.pem", base / "key.pem", Path(mtls_cluster.env["controller"][rpc.ENV_CA]))


def presented_uri(address: str, pki) -> str:
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(pki["admin"].ca))   # OpenSSL: the chain and its constraint
    context.load_cert_chain(str(pki["admin"].cert), str(pki["admin"].key))
    context.set_alpn_protocols(["h2"])
    with socket.create_connection((host, int(port)), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=host) as conn:
        return next(value for kind, value in conn.getpeercert()["subjectAltName"] if kind == "URI")


def test_each_replica_presents_its_own_worker_identity(mtls_cluster, pki, deployed):
    for instance, record in deployed.items():
        assert record["owner"] == f"cert:{instance}"
        assert presented_uri(record["address"], pki) == f"mindmotor://worker/{instance}"
        files = replica_files(mtls_cluster, instance)
        chain = x509.load_pem_x509_certificates(files.cert.read_bytes())
        assert [c.subject.rfc4514_string() for c in chain[1:]] == ["CN=MindMotor worker CA,O=MindMotor"]
        assert files.key.stat().st_mode & 0o777 == 0o600 and files.cert.stat().st_mode & 0o777 == 0o600
        pid = replica_pid(instance)
        environ = dict(item.split("=", 1) for item in
                       Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in item)
        assert environ[rpc.ENV_KEY] == str(files.key) and environ[rpc.ENV_CERT] == str(files.cert)
        assert not {"MINDMOTOR_WORKER_CA_CERT", "MINDMOTOR_WORKER_CA_KEY"} & set(environ)   # the deployer's only
        assert "key.pem" not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")


def replica_pid(instance: str) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if "--worker-id" in argv and argv[argv.index("--worker-id") + 1] == instance and "worker" in argv:
                return int(entry.name)
    raise AssertionError(f"no process of replica {instance}")


def test_one_replicas_certificate_cannot_touch_another_worker(mtls_cluster, pki, deployed):
    """The attack of issue 19: with replica 0's certificate, deregister (or mark draining, or take
    over) replica 1 and the standalone worker; drain or switch them directly."""
    mine, theirs = REPLICAS
    stolen = tls(replica_files(mtls_cluster, mine), pki["admin"].ca)
    victims = {theirs: deployed[theirs]["address"], WORKER_ID: mtls_cluster.worker}
    with rpc.channel(mtls_cluster.controller, sec=stolen) as channel:
        controller = controller_pb2_grpc.ControllerStub(channel)
        for victim, address in victims.items():
            for action, call in (
                    ("deregister", lambda: controller.Deregister(controller_pb2.DeregisterRequest(instance_id=victim),
                                                                 timeout=5)),
                    ("heartbeat for", lambda: list(controller.Heartbeat(iter([controller_pb2.HeartbeatRequest(
                        instance_id=victim, state="draining")]), timeout=5))),
                    ("register", lambda: controller.Register(controller_pb2.RegisterRequest(
                        instance_id=victim, address=address, model=MODEL), timeout=5))):
                with pytest.raises(grpc.RpcError) as refused:
                    call()
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, (victim, action)
                assert f"mindmotor://worker/{mine} may only {action} its own instance ({mine}), not {victim}" \
                    == refused.value.details()
    for address in victims.values():
        with rpc.channel(address, sec=stolen) as channel:
            worker = worker_pb2_grpc.WorkerStub(channel)
            assert code_of(lambda: worker.Drain(worker_pb2.DrainRequest(), timeout=5)) \
                == grpc.StatusCode.PERMISSION_DENIED
            assert code_of(lambda: worker.SetRole(worker_pb2.SetRoleRequest(role=Role.PREFILL.to_proto()),
                                                  timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    now = instances(mtls_cluster)
    assert {i: now[i]["state"] for i in (*REPLICAS, WORKER_ID)} == dict.fromkeys((*REPLICAS, WORKER_ID), "ready")
    assert now[theirs]["address"] == deployed[theirs]["address"] and now[theirs]["owner"] == f"cert:{theirs}"
    status = mtls_cluster.worker_status(tls(pki["admin"], pki["admin"].ca))
    assert (status.state, status.role) == ("serving", Role.MIXED.to_proto())


# ---- identities from an intermediate CA ---------------------------------------------------------

def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _sign(issuer: x509.Certificate, issuer_key, subject: str, *, ca: bool, uri: str | None = None):
    """A certificate signed by `issuer`: a CA without name constraints, or a leaf naming `uri`."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                              critical=False)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False))
    if uri:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.UniformResourceIdentifier(uri), x509.DNSName("localhost")]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256()), key


def _client(leaf: x509.Certificate, key, issuer: x509.Certificate, ca: Path) -> rpc.RpcSecurity:
    pem = serialization.Encoding.PEM
    return rpc.RpcSecurity(ca=ca.read_bytes(), cert=leaf.public_bytes(pem) + issuer.public_bytes(pem),
                           key=key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()))


def _calls(cluster, sec: rpc.RpcSecurity) -> tuple:
    """(Deregister the standalone worker, Watch) as that caller: their status codes."""
    with rpc.channel(cluster.controller, sec=sec) as channel:
        stub = controller_pb2_grpc.ControllerStub(channel)
        return (code_of(lambda: stub.Deregister(controller_pb2.DeregisterRequest(instance_id=WORKER_ID), timeout=5)),
                code_of(lambda: stub.Watch(controller_pb2.WatchRequest(), timeout=5)))


def _details(cluster, sec: rpc.RpcSecurity) -> str:
    with rpc.channel(cluster.controller, sec=sec) as channel:
        try:
            controller_pb2_grpc.ControllerStub(channel).Deregister(
                controller_pb2.DeregisterRequest(instance_id=WORKER_ID), timeout=5)
        except grpc.RpcError as exc:
            return exc.details()
    return ""


def test_a_non_worker_identity_from_an_intermediate_ca_is_refused(mtls_cluster, pki):
    root = pki["admin"].ca
    worker_ca = certs.WorkerCA.load(pki["worker-ca"].cert, pki["worker-ca"].key)
    # the worker CA's own leaves: a worker gets in (and is a worker: Watch is not for workers) ...
    leaf, key = _sign(worker_ca.cert, worker_ca.key, "w", ca=False, uri="mindmotor://worker/someone")
    assert _calls(mtls_cluster, _client(leaf, key, worker_ca.cert, root)) == \
        (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.PERMISSION_DENIED)
    # ... an admin or controller does not even finish the handshake: the name constraint
    for uri in ("mindmotor://admin/x", "mindmotor://controller/x", "mindmotor://workers/x"):
        leaf, key = _sign(worker_ca.cert, worker_ca.key, "x", ca=False, uri=uri)
        assert _calls(mtls_cluster, _client(leaf, key, worker_ca.cert, root)) == \
            (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE), uri

    # an intermediate without the constraint (signed by the root: say, an operator's mistake)
    root_cert = x509.load_pem_x509_certificate(root.read_bytes())
    root_key = serialization.load_pem_private_key((root.parent / certs.CA_KEY).read_bytes(), password=None)
    loose, loose_key = _sign(root_cert, root_key, "loose intermediate", ca=True)
    leaf, key = _sign(loose, loose_key, "x", ca=False, uri="mindmotor://admin/x")
    admin_from_loose = _client(leaf, key, loose, root)
    assert _calls(mtls_cluster, admin_from_loose) == \
        (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.UNAUTHENTICATED)          # past the handshake, not in
    assert "comes from an intermediate CA, which may only certify workers" in _details(mtls_cluster, admin_from_loose)
    leaf, key = _sign(loose, loose_key, "w", ca=False, uri="mindmotor://worker/someone")
    assert _calls(mtls_cluster, _client(leaf, key, loose, root)) == \
        (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.PERMISSION_DENIED)      # a worker, as it says
    assert mtls_cluster.routed_address(tls(pki["coordinator"], root)) == mtls_cluster.worker
