"""The certificates `mindmotor up` runs its children with: a cluster CA and one certificate per
service under STATE_DIR/pki (made once, kept while valid: `common.certs.ensure_cluster_pki`), each
child's paths in its environment (`MINDMOTOR_TLS_CA/_CERT/_KEY`, common/rpc.py), so every gRPC
call between them is mutual TLS without a flag on any command line.

    envs = child_environments(log_dir)
    ChildProcess("controller", args, ready, log, env=envs["controller"])
    envs["admin"]     # for the operator: `mindmotor deploy` / `npu-smi --worker` with these

A Deployer's local replicas get the worker certificate (`MINDMOTOR_REPLICA_TLS_*`).
"""

from __future__ import annotations

from pathlib import Path

from mindmotor.common.certs import CertPaths, ensure_cluster_pki
from mindmotor.common.rpc import ENV_REPLICA_CERT, ENV_REPLICA_KEY

SERVICES = {"controller": "controller", "worker": "worker", "coordinator": "coordinator",
            "deployer": "deployer", "trainer": "trainer", "admin": "admin"}


def child_environments(state_dir: str | Path) -> dict[str, dict[str, str]]:
    """Role → the environment variables of a child of that role (workers share one certificate)."""
    files: dict[str, CertPaths] = ensure_cluster_pki(state_dir, SERVICES)
    envs = {name: paths.env() for name, paths in files.items()}
    envs["deployer"].update({ENV_REPLICA_CERT: str(files["worker"].cert), ENV_REPLICA_KEY: str(files["worker"].key)})
    return envs
