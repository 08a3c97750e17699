"""The cluster's certificates: one CA, one ECDSA P-256 certificate per service (the `cryptography`
library). A certificate names its holder's role and name in a SAN URI `mindmotor://ROLE/NAME`
(what the servers' interceptors authorize on) and carries DNS/IP SANs for the hosts it serves on.

    ca = init_ca("pki")                                      # pki/ca.pem, pki/ca-key.pem (0600)
    paths = issue("pki", name="worker-0", role="worker", hosts=["10.0.0.5", "w0.internal"])
    paths.cert, paths.key, paths.ca                          # what --tls-cert/--tls-key/--tls-ca take
    files = ensure_cluster_pki("state", {"controller": "controller", "coordinator": "coordinator"})
    identity = identity_of(pem_bytes)                        # Identity(role="worker", name="worker-0")
    problem = verify_peer(pem_bytes, ca_pem)                 # None, or why the CA does not vouch for it

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

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ROLES = ("controller", "worker", "coordinator", "deployer", "trainer", "admin")
URI_SCHEME = "mindmotor://"
CA_CERT, CA_KEY = "ca.pem", "ca-key.pem"
DEFAULT_DAYS = 365
CA_DAYS = 3650
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


def init_ca(directory: str | Path, days: int = CA_DAYS, force: bool = False) -> CertPaths:
    """Make the cluster CA in `directory` (kept if one is there, unless `force`)."""
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
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
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
    """A certificate for service `name` of `role`, signed by the CA in `directory`, written to
    `out` (default `directory`) as NAME.pem and NAME-key.pem. `not_before`/`not_after` override
    the validity window (tests make expired certificates with them)."""
    validate_name(name, role)
    directory = Path(directory)
    ca_cert, ca_key = _load_ca(directory)
    out = Path(out) if out else directory
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    start = not_before or now - datetime.timedelta(minutes=5)
    end = not_after or now + datetime.timedelta(days=days)
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(f"{URI_SCHEME}{role}/{name}")]
    sans += _san_entries(hosts)
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "MindMotor"),
                                     x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                                     x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    key_path, cert_path = out / f"{name}-key.pem", out / f"{name}.pem"
    _write(key_path, _key_pem(key), 0o600)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    ca_path = directory / CA_CERT
    return CertPaths(cert_path, key_path, ca_path)


def identity_of(cert_pem: bytes) -> Identity | None:
    """The `mindmotor://ROLE/NAME` SAN of a certificate; None if it has none."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
        if uri.startswith(URI_SCHEME):
            role, _, name = uri[len(URI_SCHEME):].partition("/")
            if role in ROLES and name:
                return Identity(role, name)
    return None


def verify_peer(cert_pem: bytes, ca_pem: bytes, now: datetime.datetime | None = None) -> str | None:
    """None if a CA of `ca_pem` (one certificate, or a bundle while the CA is rotated) issued
    `cert_pem` and it is valid now; else what is wrong with it."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        cas = x509.load_pem_x509_certificates(ca_pem)
    except ValueError:
        return "unreadable certificate"
    if not any(_issued_by(cert, ca) for ca in cas):
        return "certificate not issued by the cluster CA"
    moment = now or _now()
    if not cert.not_valid_before_utc <= moment <= cert.not_valid_after_utc:
        return (f"certificate outside its validity window ({cert.not_valid_before_utc:%Y-%m-%dT%H:%MZ} .. "
                f"{cert.not_valid_after_utc:%Y-%m-%dT%H:%MZ})")
    return None


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
    """A CA under STATE_DIR/pki and a certificate for every `name -> role` in `services`, made
    only when missing, expiring within a day, or not matching (idempotent). Returns name → paths."""
    directory = Path(state_dir) / "pki"
    init_ca(directory)
    hosts = list(hosts) if hosts is not None else default_hosts()
    result: dict[str, CertPaths] = {}
    for name, role in services.items():
        validate_name(name, role)
        paths = CertPaths(directory / f"{name}.pem", directory / f"{name}-key.pem", directory / CA_CERT)
        if not _still_good(paths, role, name, hosts):
            paths = issue(directory, name, role, hosts)
        result[name] = paths
    return result
