"""Each local replica's own identity under mutual TLS: a certificate `mindmotor://worker/<instance
id>` (the id it registers with), issued by the *worker CA* when the replica starts and given to it
through its environment only (`MINDMOTOR_TLS_CERT/_KEY`, never its command line).

    identities = ReplicaIdentities.from_settings(cert_file, key_file, rpc.security(), log_dir, host)
    env, not_after = identities.issue("demo-v1-0")   # {} and None without mutual TLS
    identities.forget("demo-v1-0")                   # its files, once the replica is gone

The worker CA (`mindmotor certs worker-ca`; `mindmotor up` makes one) is an intermediate below the
cluster CA that can certify workers only (X.509 NameConstraints, checked again by every server),
so the Deployer never holds the root key and cannot mint an admin or controller identity. Files:
`<log dir>/certs/<instance id>/cert.pem` (the leaf, then the worker CA) and `key.pem`, 0600 in a
0700 directory; a certificate is valid `certs.REPLICA_DAYS` days and re-issued at every (re)start
of its replica. Without mutual TLS (token or open mode) replicas are told apart by their address,
and nothing is issued.
"""

from __future__ import annotations

import datetime
import shutil
from pathlib import Path

from mindmotor.common.certs import CertError, WorkerCA, default_hosts
from mindmotor.common.rpc import RpcSecurity
from mindmotor.common.rpc_args import ENV_CERT, ENV_KEY

ENV_WORKER_CA_CERT, ENV_WORKER_CA_KEY = "MINDMOTOR_WORKER_CA_CERT", "MINDMOTOR_WORKER_CA_KEY"
WILDCARDS = ("", "0.0.0.0", "::")


class ReplicaIdentities:
    def __init__(self, worker_ca: WorkerCA | None, directory: Path, hosts: list[str]):
        self.worker_ca = worker_ca
        self.directory = Path(directory)
        self.hosts = hosts

    @classmethod
    def from_settings(cls, cert: str | None, key: str | None, sec: RpcSecurity, directory: Path,
                      host: str) -> "ReplicaIdentities":
        """ValueError when the cluster speaks mutual TLS and the worker CA is missing or unusable
        (replicas could not prove who they are)."""
        hosts = default_hosts() + ([host] if host not in WILDCARDS else [])
        if not sec.tls:
            return cls(None, directory / "certs", hosts)
        if not (cert and key):
            raise ValueError(
                "local replicas under mutual TLS need the worker CA, to give each its own certificate: "
                f"--worker-ca-cert and --worker-ca-key (or {ENV_WORKER_CA_CERT}/{ENV_WORKER_CA_KEY}; "
                "made by `mindmotor certs worker-ca`)")
        try:
            return cls(WorkerCA.load(cert, key, sec.ca), directory / "certs", hosts)
        except CertError as exc:
            raise ValueError(str(exc)) from None

    def issue(self, instance_id: str) -> tuple[dict[str, str], datetime.datetime | None]:
        """The replica's TLS environment (its certificate in place of the deployer's) and when its
        certificate expires; ({}, None) without mutual TLS. CertError for an impossible name."""
        if self.worker_ca is None:
            return {}, None
        leaf = self.worker_ca.issue(instance_id, self.hosts, self.directory / instance_id)
        return {ENV_CERT: str(leaf.cert), ENV_KEY: str(leaf.key)}, leaf.not_after

    def forget(self, instance_id: str) -> None:
        shutil.rmtree(self.directory / instance_id, ignore_errors=True)
