"""`mindmotor certs` and `ensure_cluster_pki`: ECDSA P-256 keys written 0600, the role and name in
a SAN URI, host SANs, idempotent (kept while valid, re-issued when expiring or wrong), clear
errors for bad input."""

from __future__ import annotations

import datetime
import subprocess
import sys

from cryptography import x509
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
