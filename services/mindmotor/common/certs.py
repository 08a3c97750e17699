"""The cluster's certificates: one root CA, one ECDSA P-256 certificate per service (the
`cryptography` library), and a *worker CA* below the root that can only certify workers. A
certificate names its holder's role and name in a SAN URI `mindmotor://ROLE/NAME` (what the
servers' interceptors authorize on) and carries DNS/IP SANs for the hosts it serves on.

    ca = init_ca("pki")                                      # pki/ca.pem, pki/ca-key.pem (0600)
    paths = issue("pki", name="worker-0", role="worker", hosts=["10.0.0.5", "w0.internal"])
    paths.cert, paths.key, paths.ca                          # what --tls-cert/--tls-key/--tls-ca take
    files = ensure_cluster_pki("state", {"controller": "controller", "coordinator": "coordinator"})
    identity = identity_of(pem_bytes)                        # Identity(role="worker", name="worker-0")
    problem = verify_peer(pem_bytes, ca_pem)                 # None, or why the CA does not vouch for it

    wca = init_worker_ca("pki")                              # pki/worker-ca.pem, pki/worker-ca-key.pem
    issuer = WorkerCA.load(wca.cert, wca.key, ca_pem)        # what a Deployer holds (never the root key)
    leaf = issuer.issue("demo-v1-0", hosts, out_dir)         # mindmotor://worker/demo-v1-0, chain file
    peer_identity(leaf_pem, ca_pem)                          # who a peer is, and whether its issuer may say so

The hierarchy: the root (pathLenConstraint 1) signs every service certificate of every role
directly, and the worker CA (pathLenConstraint 0, X.509 NameConstraints permitting only URIs whose
host is `worker`), whose leaves — `mindmotor://worker/<instance id>`, one per replica, files
`cert.pem` (leaf + worker CA) and `key.pem` — a Deployer issues. A leaf of any other role from it
fails the TLS handshake (BoringSSL enforces the constraint) and, independently, `peer_identity`
(only the root issues non-worker identities).

Keys are written 0600; certificates and the CA certificate 0644. `ensure_cluster_pki` is
idempotent: it keeps a CA and certificates that are valid for another day and re-issues the rest.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ROLES = ("controller", "worker", "coordinator", "deployer", "trainer", "admin")
URI_SCHEME = "mindmotor://"
CA_CERT, CA_KEY = "ca.pem", "ca-key.pem"
WORKER_CA_CERT, WORKER_CA_KEY = "worker-ca.pem", "worker-ca-key.pem"
WORKER_URI_HOST = "worker"             # the worker CA's NameConstraints: mindmotor://worker/... only
DEFAULT_DAYS = 365
CA_DAYS = 3650
WORKER_CA_DAYS = 365
REPLICA_DAYS = 30                      # a Deployer's per-replica leaf (re-issued at every (re)start)
RENEW_BEFORE = datetime.timedelta(days=1)
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True)
class Identity:
    role: str
    name: str

    def __str__(self) -> str:
        return f"{self.role}/{self.name}"


@dataclass(frozen=True)
class CertPaths:
    cert: Path
    key: Path
    ca: Path

    def env(self) -> dict[str, str]:
        """The environment a child process reads its TLS files from (common/rpc.py)."""
        return {"MINDMOTOR_TLS_CA": str(self.ca), "MINDMOTOR_TLS_CERT": str(self.cert),
                "MINDMOTOR_TLS_KEY": str(self.key)}


class CertError(ValueError):
    """A bad name, role, host or an unreadable CA."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _write(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


_CA_USAGE = x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                          key_encipherment=False, data_encipherment=False, key_agreement=False,
                          encipher_only=False, decipher_only=False)


def init_ca(directory: str | Path, days: int = CA_DAYS, force: bool = False) -> CertPaths:
    """Make the cluster's root CA in `directory` (kept if one is there, unless `force`). Its
    pathLenConstraint is 1: it may certify one level of CA below it (the worker CA), no deeper."""
    directory = Path(directory)
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    if cert_path.exists() and key_path.exists() and not force:
        return CertPaths(cert_path, key_path, cert_path)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "MindMotor"),
                      x509.NameAttribute(NameOID.COMMON_NAME, "MindMotor cluster CA")])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=1), critical=True)
            .add_extension(_CA_USAGE, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    _write(key_path, _key_pem(key), 0o600)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return CertPaths(cert_path, key_path, cert_path)


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise CertError(f"no usable cluster CA in {directory} (run `mindmotor certs init --dir {directory}`): "
                        f"{type(exc).__name__}") from exc
    return cert, key


def _san_entries(hosts: Iterable[str]) -> list[x509.GeneralName]:
    entries: list[x509.GeneralName] = []
    for host in dict.fromkeys(h.strip() for h in hosts if h and h.strip()):
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            if not all(part and (part.replace("-", "").isalnum() or part == "*") for part in host.split(".")):
                raise CertError(f"not a host name or IP address: {host!r}") from None
            entries.append(x509.DNSName(host))
    return entries


def validate_name(name: str, role: str) -> None:
    if role not in ROLES:
        raise CertError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise CertError(f"a certificate name is letters, digits, '-', '_' and '.', got {name!r}")


def issue(directory: str | Path, name: str, role: str, hosts: Iterable[str] = LOCAL_HOSTS,
          days: int = DEFAULT_DAYS, not_before: datetime.datetime | None = None,
          not_after: datetime.datetime | None = None, out: str | Path | None = None) -> CertPaths:
    """A certificate for service `name` of `role`, signed by the root CA in `directory`, written to
    `out` (default `directory`) as NAME.pem and NAME-key.pem. `not_before`/`not_after` override
    the validity window (tests make expired certificates with them)."""
    validate_name(name, role)
    directory = Path(directory)
    ca_cert, ca_key = _load_ca(directory)
    out = Path(out) if out else directory
    now = _now()
    cert, key = _sign_leaf(ca_cert, ca_key, name, role, hosts, not_before or now - datetime.timedelta(minutes=5),
                           not_after or now + datetime.timedelta(days=days))
    key_path, cert_path = out / f"{name}-key.pem", out / f"{name}.pem"
    _write(key_path, _key_pem(key), 0o600)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return CertPaths(cert_path, key_path, directory / CA_CERT)


def _sign_leaf(issuer: x509.Certificate, issuer_key: ec.EllipticCurvePrivateKey, name: str, role: str,
               hosts: Iterable[str], start: datetime.datetime, end: datetime.datetime
               ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(f"{URI_SCHEME}{role}/{name}")]
    sans += _san_entries(hosts)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "MindMotor"),
                                     x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                                     x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(issuer.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False)
            .sign(issuer_key, hashes.SHA256()))
    return cert, key


# ---- the worker CA: an intermediate that can only certify workers --------------------------------

def can_certify_a_ca(root: x509.Certificate) -> bool:
    """Whether `root` may sign an intermediate CA (roots made before the worker CA have
    pathLenConstraint 0 and may not)."""
    try:
        constraints = root.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return False
    return constraints.ca and (constraints.path_length is None or constraints.path_length >= 1)


def init_worker_ca(directory: str | Path, out: str | Path | None = None, days: int = WORKER_CA_DAYS) -> CertPaths:
    """The worker CA, signed by the root CA in `directory`, written to `out` (default
    `directory`) as worker-ca.pem and worker-ca-key.pem (0600); `ca` of the result is the root.
    CertError if the root cannot certify a CA (made before pathLenConstraint 1)."""
    directory = Path(directory)
    root, root_key = _load_ca(directory)
    if not can_certify_a_ca(root):
        raise CertError(f"the CA in {directory} was made with pathLenConstraint 0 and cannot certify the worker CA: "
                        f"make a new one (`mindmotor certs init --dir DIR --force`, then re-issue every "
                        f"certificate; docs/security.md, Rotating)")
    out = Path(out) if out else directory
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    end = min(now + datetime.timedelta(days=days), root.not_valid_after_utc)
    constraints = x509.NameConstraints(permitted_subtrees=[x509.UniformResourceIdentifier(WORKER_URI_HOST)],
                                       excluded_subtrees=None)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "MindMotor"),
                                     x509.NameAttribute(NameOID.COMMON_NAME, "MindMotor worker CA")]))
            .issuer_name(root.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_CA_USAGE, critical=True)
            .add_extension(constraints, critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(root_key.public_key()), critical=False)
            .sign(root_key, hashes.SHA256()))
    cert_path, key_path = out / WORKER_CA_CERT, out / WORKER_CA_KEY
    _write(key_path, _key_pem(key), 0o600)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    return CertPaths(cert_path, key_path, directory / CA_CERT)


def _is_worker_ca(cert: x509.Certificate) -> bool:
    """A CA below which no CA may be (pathLenConstraint 0), permitting only worker URIs."""
    try:
        basic = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        names = cert.extensions.get_extension_for_class(x509.NameConstraints).value
    except x509.ExtensionNotFound:
        return False
    return (basic.ca and basic.path_length == 0
            and list(names.permitted_subtrees or ()) == [x509.UniformResourceIdentifier(WORKER_URI_HOST)])


@dataclass(frozen=True)
class Leaf:
    cert: Path                 # the leaf, then the worker CA (the chain a peer is shown)
    key: Path
    not_after: datetime.datetime


class WorkerCA:
    """What a Deployer holds to give each replica its own `mindmotor://worker/<instance id>`:
    the worker CA's certificate and key (never the root's)."""

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey, days: float = REPLICA_DAYS):
        self.cert, self.key, self.days = cert, key, days
        self._chain = cert.public_bytes(serialization.Encoding.PEM)

    @classmethod
    def load(cls, cert_path: str | Path, key_path: str | Path, ca_pem: bytes | None = None) -> "WorkerCA":
        """CertError unless the files are a worker CA (made by `init_worker_ca`) and its key, valid
        now and, given `ca_pem` (the cluster CA bundle), issued by it."""
        try:
            cert = x509.load_pem_x509_certificate(Path(cert_path).read_bytes())
            key = serialization.load_pem_private_key(Path(key_path).read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise CertError(f"cannot read the worker CA ({cert_path}, {key_path}): {type(exc).__name__}") from None
        if not _is_worker_ca(cert):
            raise CertError(f"{cert_path} is not a worker CA (an intermediate with pathLenConstraint 0 permitting only "
                            f"{URI_SCHEME}{WORKER_URI_HOST}/ names: `mindmotor certs worker-ca`)")
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
            raise CertError(f"{key_path} is not the key of the worker CA {cert_path}")
        if ca_pem is not None:
            problem = _issuer_problem(cert, x509.load_pem_x509_certificates(ca_pem), _now())
            if problem:
                raise CertError(f"the worker CA {cert_path}: {problem}")
        return cls(cert, key)

    def issue(self, name: str, hosts: Iterable[str], out: str | Path) -> Leaf:
        """`out`/cert.pem (leaf + worker CA) and `out`/key.pem, both 0600, `out` 0700: a
        certificate for worker instance `name`, valid `days` (at most as long as the worker CA)."""
        validate_name(name, "worker")
        now = _now()
        end = min(now + datetime.timedelta(days=self.days), self.cert.not_valid_after_utc)
        cert, key = _sign_leaf(self.cert, self.key, name, "worker", hosts, now - datetime.timedelta(minutes=5), end)
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(out, 0o700)
        key_path, cert_path = out / "key.pem", out / "cert.pem"
        _write(key_path, _key_pem(key), 0o600)
        _write(cert_path, cert.public_bytes(serialization.Encoding.PEM) + self._chain, 0o600)
        return Leaf(cert_path, key_path, end)


def _identities(cert: x509.Certificate) -> list[Identity]:
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    found = []
    for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
        if uri.startswith(URI_SCHEME):
            role, _, name = uri[len(URI_SCHEME):].partition("/")
            if role in ROLES and name:
                found.append(Identity(role, name))
    return found


def identity_of(cert_pem: bytes) -> Identity | None:
    """The `mindmotor://ROLE/NAME` SAN of a certificate (the first of a chain); None if it has none."""
    found = _identities(x509.load_pem_x509_certificate(cert_pem))
    return found[0] if found else None


def peer_identity(cert_pem: bytes, ca_pem: bytes) -> Identity:
    """Who the peer whose certificate (the leaf) the TLS handshake verified is: its one
    `mindmotor://ROLE/NAME`, which it may only claim if it is no CA and, unless ROLE is worker,
    a root CA of `ca_pem` signed it directly — the worker CA (any intermediate) vouches for
    workers only, whatever the handshake allowed. CertError saying why not."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        roots = x509.load_pem_x509_certificates(ca_pem)
    except ValueError:
        raise CertError("unreadable client certificate") from None
    found = _identities(cert)
    if len(found) != 1:
        raise CertError("the client certificate names no mindmotor://ROLE/NAME identity" if not found else
                        "the client certificate names more than one mindmotor://ROLE/NAME identity")
    try:
        if cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca:
            raise CertError("a CA certificate is no client identity")
    except x509.ExtensionNotFound:
        pass
    identity = found[0]
    if identity.role != "worker" and not any(_issued_by(cert, root) for root in roots):
        raise CertError(f"{URI_SCHEME}{identity} comes from an intermediate CA, which may only certify workers; "
                        f"{identity.role} certificates must be issued by the cluster CA itself")
    return identity


def verify_peer(cert_pem: bytes, ca_pem: bytes, now: datetime.datetime | None = None) -> str | None:
    """None if a CA of `ca_pem` (one certificate, or a bundle while the CA is rotated) vouches for
    `cert_pem` — a certificate it issued, or one of the worker CA's followed by the worker CA — and
    it is valid now; else what is wrong with it."""
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
        cas = x509.load_pem_x509_certificates(ca_pem)
    except ValueError:
        return "unreadable certificate"
    moment = now or _now()
    leaf, intermediates = chain[0], chain[1:]
    if any(_issued_by(leaf, ca) for ca in cas):
        return _window_problem(leaf, moment, "certificate")
    via = next((c for c in intermediates if _issued_by(leaf, c)), None)
    if via is None or not any(_issued_by(via, ca) for ca in cas):
        return "certificate not issued by the cluster CA"
    problem = _window_problem(leaf, moment, "certificate") or _window_problem(via, moment, "its issuing CA")
    if problem:
        return problem
    if not _is_worker_ca(via):
        return "certificate issued by an intermediate CA that is not the worker CA"
    if not _within_worker_constraint(leaf):
        return "the worker CA's certificate names something other than mindmotor://worker/NAME"
    return None


def _within_worker_constraint(cert: x509.Certificate) -> bool:
    """What the worker CA's NameConstraints say (checked here too: the `cryptography` verifier
    does not implement URI constraints): every URI names host `worker`, and there is one
    `mindmotor://worker/NAME`; not a CA."""
    try:
        if cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca:
            return False
        uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
            .get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        return False
    return (all(urlsplit(uri).hostname == WORKER_URI_HOST for uri in uris)
            and [i.role for i in _identities(cert)] == ["worker"])


def _window_problem(cert: x509.Certificate, moment: datetime.datetime, what: str) -> str | None:
    if cert.not_valid_before_utc <= moment <= cert.not_valid_after_utc:
        return None
    return (f"{what} outside its validity window ({cert.not_valid_before_utc:%Y-%m-%dT%H:%MZ} .. "
            f"{cert.not_valid_after_utc:%Y-%m-%dT%H:%MZ})")


def _issuer_problem(cert: x509.Certificate, cas: list[x509.Certificate], moment: datetime.datetime) -> str | None:
    """None if a CA of `cas` issued `cert` directly and it is valid at `moment`."""
    if not any(_issued_by(cert, ca) for ca in cas):
        return "certificate not issued by the cluster CA"
    return _window_problem(cert, moment, "certificate")


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _still_good(paths: CertPaths, role: str, name: str, hosts: Iterable[str]) -> bool:
    try:
        pem = paths.cert.read_bytes()
        if not paths.key.exists() or verify_peer(pem, paths.ca.read_bytes(), _now() + RENEW_BEFORE):
            return False
        cert = x509.load_pem_x509_certificate(pem)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    have = {str(v) for v in sans.get_values_for_type(x509.DNSName)} | \
        {str(v) for v in sans.get_values_for_type(x509.IPAddress)}
    wanted = {str(e.value) for e in _san_entries(hosts)}
    return identity_of(pem) == Identity(role, name) and wanted <= have


def default_hosts() -> list[str]:
    """What a certificate for a service on this machine names: loopback and the host name."""
    return list(dict.fromkeys([*LOCAL_HOSTS, socket.gethostname()]))


def ensure_cluster_pki(state_dir: str | Path, services: Mapping[str, str],
                       hosts: Iterable[str] | None = None) -> dict[str, CertPaths]:
    """A root CA under STATE_DIR/pki and a certificate for every `name -> role` in `services`, made
    only when missing, expiring within a day, or not matching (idempotent). A root that cannot
    certify the worker CA (pathLenConstraint 0, from before it) is replaced, and with it every
    certificate. Returns name → paths."""
    directory = Path(state_dir) / "pki"
    root = init_ca(directory)
    if not can_certify_a_ca(x509.load_pem_x509_certificate(root.cert.read_bytes())):
        init_ca(directory, force=True)
    hosts = list(hosts) if hosts is not None else default_hosts()
    result: dict[str, CertPaths] = {}
    for name, role in services.items():
        validate_name(name, role)
        paths = CertPaths(directory / f"{name}.pem", directory / f"{name}-key.pem", directory / CA_CERT)
        if not _still_good(paths, role, name, hosts):
            paths = issue(directory, name, role, hosts)
        result[name] = paths
    return result


def ensure_worker_ca(state_dir: str | Path) -> CertPaths:
    """The worker CA under STATE_DIR/pki (after `ensure_cluster_pki`), made anew when missing,
    not issued by the current root, or expiring within a replica certificate's life (so every leaf
    gets its full `REPLICA_DAYS`)."""
    directory = Path(state_dir) / "pki"
    paths = CertPaths(directory / WORKER_CA_CERT, directory / WORKER_CA_KEY, directory / CA_CERT)
    try:
        current = WorkerCA.load(paths.cert, paths.key, paths.ca.read_bytes())
        if current.cert.not_valid_after_utc > _now() + datetime.timedelta(days=REPLICA_DAYS) + RENEW_BEFORE:
            return paths
    except (CertError, OSError):
        pass
    return init_worker_ca(directory)
