"""The certificates `mindmotor up` runs its children with: a cluster CA and one certificate per
service under STATE_DIR/pki (made once, kept while valid: `common.certs.ensure_cluster_pki`), each
child's paths in its environment (`MINDMOTOR_TLS_CA/_CERT/_KEY`, common/rpc.py), so every gRPC
call between them is mutual TLS without a flag on any command line.

    envs = child_environments(log_dir)
    ChildProcess("controller", args, ready, log, env=envs["controller"])
    envs["admin"]     # for the operator: `mindmotor deploy` / `npu-smi --worker` with these

Workers have no certificate here: the Deployer gets the worker CA (`MINDMOTOR_WORKER_CA_CERT/_KEY`,
`certs.ensure_worker_ca`; never the root CA's key) and gives each replica its own
`mindmotor://worker/<instance id>` (deployer/backends/replica_identity.py).
"""

from __future__ import annotations

from pathlib import Path

from mindmotor.common.certs import CertPaths, ensure_cluster_pki, ensure_worker_ca

SERVICES = {"controller": "controller", "coordinator": "coordinator", "deployer": "deployer",
            "trainer": "trainer", "admin": "admin"}


def child_environments(state_dir: str | Path) -> dict[str, dict[str, str]]:
    """Role → the environment variables of a child of that role."""
    files: dict[str, CertPaths] = ensure_cluster_pki(state_dir, SERVICES)
    worker_ca = ensure_worker_ca(state_dir)
    envs = {name: paths.env() for name, paths in files.items()}
    envs["deployer"].update({"MINDMOTOR_WORKER_CA_CERT": str(worker_ca.cert),
                             "MINDMOTOR_WORKER_CA_KEY": str(worker_ca.key)})
    return envs
