"""The environment a local replica (`mindmotor worker`) starts with: an explicit allow-list of the
deployer's variables, never the whole environment — a worker reads no secret of the deployer's
(`MINDMOTOR_ADMIN_TOKEN`, `MINDMOTOR_REDIS_URL`, API keys), so it never gets one.

    env = worker_environment({"MINDMOTOR_TLS_CERT": ...})   # `extra` on top (None: removed)

Kept: what runs Python and numpy (PATH, PYTHONPATH, the virtualenv, locale, temp dir, BLAS
settings such as OPENBLAS_CORETYPE and the thread counts), gRPC's own settings, and the cluster's
transport security (`MINDMOTOR_TLS_*`,
`MINDMOTOR_CLUSTER*`: what a worker needs to talk to its controller).
"""

from __future__ import annotations

import os
from typing import Mapping

ALLOWED = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
    "PYTHONPATH", "PYTHONHASHSEED", "VIRTUAL_ENV", "LD_LIBRARY_PATH",
    "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS",
    "SSL_CERT_FILE", "SSL_CERT_DIR",
})
# OPENBLAS_*: some machines set OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE because older OpenBLAS builds
# compute wrong results or crash on their processors; a worker must run numpy as its parent does.
ALLOWED_PREFIXES = ("LC_", "GRPC_", "OPENBLAS_", "OMP_", "MKL_", "MINDMOTOR_TLS_", "MINDMOTOR_CLUSTER")
FIXED = {"PYTHONUNBUFFERED": "1", "GRPC_ENABLE_FORK_SUPPORT": "false"}


def allowed(name: str) -> bool:
    return name in ALLOWED or name.startswith(ALLOWED_PREFIXES)


def worker_environment(extra: Mapping[str, str | None] | None = None,
                       source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allowed variables of `source` (default: this process's environment), then `FIXED`,
    then `extra` (a None value removes a variable)."""
    env = {name: value for name, value in (os.environ if source is None else source).items() if allowed(name)}
    env.update(FIXED)
    env.update(extra or {})
    return {name: value for name, value in env.items() if value is not None}
