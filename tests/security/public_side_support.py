"""Real parts for the public-side security tests: a test CA and server certificate (made here with
`cryptography`), a password-protected redis-server of our own on a free port, `mindmotor` service
subprocesses started the recommended way (secrets in the environment or in files, never in argv),
and the search of logs and bodies for the secrets the tests handed out."""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mindmotor.common.ports import free_port
from mindmotor.common.waiting import wait_until
from secrets_registry import given_private_key, given_secret
from mindmotor.runtime.child_process import ChildProcess

START_TIMEOUT_S = 60.0


def token(prefix: str) -> str:
    """A distinctive secret: easy to find in a log if it leaked."""
    return given_secret(f"{prefix}-{secrets.token_hex(12)}")


# ---- certificates ---------------------------------------------------------------------------------

@dataclass
class PKI:
    ca_cert: Path
    server_cert: Path
    server_key: Path


def make_pki(directory: Path, hostnames: tuple[str, ...] = ("localhost",),
             addresses: tuple[str, ...] = ("127.0.0.1",)) -> PKI:
    """A CA (self-signed) and a server certificate it signed for `hostnames` and `addresses`, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mindmotor test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName(h) for h in hostnames] + [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostnames[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    pki = PKI(directory / "ca.crt", directory / "tls.crt", directory / "tls.key")
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.server_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pki.server_key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()))
    pki.server_key.chmod(0o600)
    given_private_key(pki.server_key)
    return pki


# ---- a Redis with a password ----------------------------------------------------------------------

class PasswordRedis:
    """`redis-server --requirepass` on a free loopback port (its password on *its* command line:
    it is the test's Redis, not a MindMotor service)."""

    def __init__(self, directory: Path):
        self.password = token("redispw")
        self.port = free_port()
        self.url = f"redis://:{self.password}@127.0.0.1:{self.port}/0"
        self.log_path = directory / "redis.log"
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--requirepass", self.password,
             "--save", "", "--appendonly", "no", "--logfile", str(self.log_path)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        client = redis.Redis(port=self.port, password=self.password, socket_timeout=1)
        try:
            wait_until(lambda: self._pings(client), timeout=15)
        finally:
            client.close()

    def _pings(self, client) -> bool:
        import redis

        if self.proc.poll() is not None:
            raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


# ---- services -------------------------------------------------------------------------------------

def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a child: ours without MINDMOTOR_* (the test decides those), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINDMOTOR_")}
    env.update(extra)
    return env


class Service:
    """A `mindmotor` subprocess (ChildProcess), with its own environment; `stop` kills it."""

    def __init__(self, name: str, args: list[str], ready_prefix: str, log_path: Path,
                 env: dict[str, str] | None = None, wait: bool = True):
        self.child = ChildProcess(name, args, ready_prefix, log_path, env=env)
        self.proc = self.child.proc
        self.log_path = log_path
        self.ready: dict[str, str] = {}
        if wait:
            self.wait_ready()

    def wait_ready(self) -> dict[str, str]:
        try:
            self.ready = self.child.wait_ready(START_TIMEOUT_S)
        except BaseException:
            self.stop()
            raise
        return self.ready

    def cmdline(self) -> str:
        return Path(f"/proc/{self.proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()

    def environ_names(self) -> set[str]:
        raw = Path(f"/proc/{self.proc.pid}/environ").read_bytes().split(b"\0")
        return {item.split(b"=", 1)[0].decode() for item in raw if item}

    def log_text(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop(self) -> None:
        self.child.kill()


def leaks(texts: dict[str, str], secret_values: list[str]) -> list[tuple[str, str]]:
    """(where, which secret) for every secret found in a text."""
    return [(where, s[:10] + "...") for where, text in texts.items() for s in secret_values if s and s in text]
