"""`mindmotor certs` and `ensure_cluster_pki`: ECDSA P-256 keys written 0600, the role and name in
a SAN URI, host SANs, idempotent (kept while valid, re-issued when expiring or wrong), clear
errors for bad input."""

from __future__ import annotations

import datetime
import subprocess
import sys

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from mindmotor.common import certs

SERVICES = {"controller": "controller", "worker": "worker", "admin": "admin"}


def test_ensure_cluster_pki_is_idempotent_and_renews(tmp_path):
    first = certs.ensure_cluster_pki(tmp_path, SERVICES, hosts=["127.0.0.1", "ctrl.internal"])
    for name, paths in first.items():
        assert paths.key.stat().st_mode & 0o777 == 0o600
        cert = x509.load_pem_x509_certificate(paths.cert.read_bytes())
        assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey) and cert.public_key().curve.name == "secp256r1"
        assert certs.identity_of(paths.cert.read_bytes()) == certs.Identity(SERVICES[name], name)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert sans.get_values_for_type(x509.DNSName) == ["ctrl.internal"]
        assert certs.verify_peer(paths.cert.read_bytes(), paths.ca.read_bytes()) is None
    assert (tmp_path / "pki" / "ca-key.pem").stat().st_mode & 0o777 == 0o600
    before = {name: paths.cert.read_bytes() for name, paths in first.items()}
    again = certs.ensure_cluster_pki(tmp_path, SERVICES, hosts=["127.0.0.1", "ctrl.internal"])
    assert {name: paths.cert.read_bytes() for name, paths in again.items()} == before       # kept

    now = datetime.datetime.now(datetime.timezone.utc)          # one expiring within the day, one for other hosts
    certs.issue(tmp_path / "pki", "worker", "worker", hosts=["127.0.0.1", "ctrl.internal"],
                not_after=now + datetime.timedelta(hours=2))
    renewed = certs.ensure_cluster_pki(tmp_path, SERVICES, hosts=["127.0.0.1", "ctrl.internal", "10.0.0.9"])
    assert all(renewed[name].cert.read_bytes() != before[name] for name in SERVICES)
    assert renewed["controller"].ca.read_bytes() == first["controller"].ca.read_bytes()        # the same CA


def test_verify_peer_names_what_is_wrong(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    certs.init_ca(ours), certs.init_ca(theirs)
    now = datetime.datetime.now(datetime.timezone.utc)
    expired = certs.issue(ours, "old", "worker", not_before=now - datetime.timedelta(days=3),
                          not_after=now - datetime.timedelta(days=1))
    foreign = certs.issue(theirs, "intruder", "admin")
    ca = (ours / "ca.pem").read_bytes()
    assert "validity window" in certs.verify_peer(expired.cert.read_bytes(), ca)
    assert "not issued by the cluster CA" in certs.verify_peer(foreign.cert.read_bytes(), ca)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mindmotor.cli", "certs", *args], capture_output=True, text=True,
                          timeout=60)


def test_the_certs_command(tmp_path):
    pki = str(tmp_path / "pki")
    assert run("issue", "--dir", pki, "--name", "w", "--role", "worker").returncode == 1     # no CA yet
    done = run("init", "--dir", pki)
    assert done.returncode == 0, done.stderr
    done = run("issue", "--dir", pki, "--name", "worker-a", "--role", "worker", "--host", "10.0.0.5",
               "--host", "w-a.internal", "--days", "30")
    assert done.returncode == 0, done.stderr
    assert "--tls-cert" in done.stdout and "mindmotor://worker/worker-a" in done.stdout
    shown = run("show", str(tmp_path / "pki" / "worker-a.pem"))
    assert "identity: worker/worker-a" in shown.stdout and "10.0.0.5" in shown.stdout and "w-a.internal" in shown.stdout
    bad_role = run("issue", "--dir", pki, "--name", "x", "--role", "root")
    assert bad_role.returncode == 2 and "invalid choice" in bad_role.stderr
    bad_host = run("issue", "--dir", pki, "--name", "x", "--role", "worker", "--host", "not a host!")
    assert bad_host.returncode == 1 and "not a host name or IP address" in bad_host.stderr
    bad_name = run("issue", "--dir", pki, "--name", "../escape", "--role", "worker")
    assert bad_name.returncode == 1 and "certificate name" in bad_name.stderr


def test_a_service_given_a_certificate_its_cluster_would_refuse_does_not_start(tmp_path):
    from mindmotor.common import rpc

    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    certs.init_ca(ours), certs.init_ca(theirs)
    now = datetime.datetime.now(datetime.timezone.utc)
    expired = certs.issue(ours, "old", "worker", not_before=now - datetime.timedelta(days=3),
                          not_after=now - datetime.timedelta(days=1))
    foreign = certs.issue(theirs, "w", "worker")
    for paths, problem in ((expired, "validity window"), (foreign, "not issued by the cluster CA")):
        try:
            rpc.RpcSecurity.load(str(ours / "ca.pem"), str(paths.cert), str(paths.key))
            raise AssertionError("accepted")
        except rpc.RpcSettingsError as exc:
            assert problem in str(exc)
    bundle = tmp_path / "both.pem"                      # a CA rotation: either CA's certificates are good
    bundle.write_bytes((ours / "ca.pem").read_bytes() + (theirs / "ca.pem").read_bytes())
    assert rpc.RpcSecurity.load(str(bundle), str(foreign.cert), str(foreign.key)).mode == "mtls"


def test_the_worker_ca_certifies_workers_only(tmp_path):
    from mindmotor.common import rpc

    certs.init_ca(tmp_path)
    made = certs.init_worker_ca(tmp_path)
    ca = (tmp_path / "ca.pem").read_bytes()
    wca = x509.load_pem_x509_certificate(made.cert.read_bytes())
    basic = wca.extensions.get_extension_for_class(x509.BasicConstraints)
    names = wca.extensions.get_extension_for_class(x509.NameConstraints)
    assert (basic.value.ca, basic.value.path_length, names.critical) == (True, 0, True)
    assert list(names.value.permitted_subtrees) == [x509.UniformResourceIdentifier("worker")]
    assert made.key.stat().st_mode & 0o777 == 0o600 and certs.verify_peer(made.cert.read_bytes(), ca) is None

    issuer = certs.WorkerCA.load(made.cert, made.key, ca)
    leaf = issuer.issue("demo-v1-0", ["127.0.0.1"], tmp_path / "replica")
    chain = x509.load_pem_x509_certificates(leaf.cert.read_bytes())
    assert len(chain) == 2 and chain[1] == wca                      # the leaf, then the worker CA
    assert certs.identity_of(leaf.cert.read_bytes()) == certs.Identity("worker", "demo-v1-0")
    assert (tmp_path / "replica").stat().st_mode & 0o777 == 0o700
    assert leaf.key.stat().st_mode & 0o777 == 0o600 and leaf.cert.stat().st_mode & 0o777 == 0o600
    life = chain[0].not_valid_after_utc - chain[0].not_valid_before_utc
    assert datetime.timedelta(days=certs.REPLICA_DAYS) <= life <= datetime.timedelta(days=certs.REPLICA_DAYS, hours=1)
    assert certs.verify_peer(leaf.cert.read_bytes(), ca) is None
    assert certs.peer_identity(chain[0].public_bytes(serialization.Encoding.PEM), ca).name == "demo-v1-0"
    assert rpc.RpcSecurity.load(str(tmp_path / "ca.pem"), str(leaf.cert), str(leaf.key)).mode == "mtls"
    # a leaf alone (without the worker CA after it) is not vouched for by the root
    alone = chain[0].public_bytes(serialization.Encoding.PEM)
    assert certs.verify_peer(alone, ca) == "certificate not issued by the cluster CA"

    for cert, key, problem in ((tmp_path / "ca.pem", tmp_path / "ca-key.pem", "is not a worker CA"),   # the root
                               (made.cert, tmp_path / "ca-key.pem", "is not the key of the worker CA")):
        try:
            certs.WorkerCA.load(cert, key, ca)
            raise AssertionError("accepted")
        except certs.CertError as exc:
            assert problem in str(exc)
    try:
        issuer.issue("../x", ["127.0.0.1"], tmp_path / "bad")
        raise AssertionError("accepted")
    except certs.CertError as exc:
        assert "certificate name" in str(exc)


def test_a_root_ca_from_before_the_worker_ca_is_replaced_where_up_manages_it(tmp_path):
    from cryptography.hazmat.primitives import hashes

    directory = tmp_path / "pki"                     # a root as `certs init` made them: pathLenConstraint 0
    directory.mkdir()
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "old CA")])
    now = datetime.datetime.now(datetime.timezone.utc)
    old = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
           .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=10))
           .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True).sign(key, hashes.SHA256()))
    (directory / "ca.pem").write_bytes(old.public_bytes(serialization.Encoding.PEM))
    (directory / "ca-key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                             serialization.PrivateFormat.PKCS8,
                                                             serialization.NoEncryption()))
    try:
        certs.init_worker_ca(directory)
        raise AssertionError("an intermediate below a pathLenConstraint 0 root")
    except certs.CertError as exc:
        assert "pathLenConstraint 0" in str(exc) and "--force" in str(exc)
    files = certs.ensure_cluster_pki(tmp_path, {"admin": "admin"})
    root = (directory / "ca.pem").read_bytes()
    assert root != old.public_bytes(serialization.Encoding.PEM)
    assert certs.can_certify_a_ca(x509.load_pem_x509_certificate(root))
    assert certs.verify_peer(files["admin"].cert.read_bytes(), root) is None
    first = certs.ensure_worker_ca(tmp_path)
    assert certs.ensure_worker_ca(tmp_path).cert.read_bytes() == first.cert.read_bytes()     # kept while good


def test_the_worker_ca_command(tmp_path):
    pki = str(tmp_path / "pki")
    assert run("worker-ca", "--dir", pki).returncode == 1                   # no cluster CA yet
    assert run("init", "--dir", pki).returncode == 0
    done = run("worker-ca", "--dir", pki, "--out", str(tmp_path / "deployer"))
    assert done.returncode == 0, done.stderr
    assert "--worker-ca-cert" in done.stdout and (tmp_path / "deployer" / "worker-ca-key.pem").stat().st_mode & 0o777 \
        == 0o600
    issuer = certs.WorkerCA.load(tmp_path / "deployer" / "worker-ca.pem", tmp_path / "deployer" / "worker-ca-key.pem",
                                 (tmp_path / "pki" / "ca.pem").read_bytes())
    leaf = issuer.issue("w-1", ["127.0.0.1"], tmp_path / "w-1")
    shown = run("show", str(leaf.cert))
    assert "identity: worker/w-1" in shown.stdout and "chain:    CN=MindMotor worker CA" in shown.stdout
