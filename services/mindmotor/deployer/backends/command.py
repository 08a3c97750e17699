"""The `mindmotor worker` command line of one replica: the version's own settings plus what places
the replica — its controller, the served model name, deployment, version, role and id — so that
it registers where the coordinators will find it, under the version the traffic weights name."""

from __future__ import annotations

from ..worker_settings import worker_flags
from .base import VersionTarget


def instance_id(deployment: str, version: str, slot: int) -> str:
    """The id a local replica registers with (stable across restarts of the slot)."""
    return f"{deployment}-{version}-{slot}"


def worker_args(target: VersionTarget, role: str, controller: str, worker_id: str) -> list[str]:
    """`worker ...` — everything but where it listens (each backend adds that)."""
    version = target.version
    args = ["worker", "--controller", controller, "--served-model-name", target.deployment.model,
            "--deployment", target.deployment.name, "--version", version.name, "--role", role,
            "--worker-id", worker_id]
    if version.checkpoint:
        args += ["--model", version.checkpoint]
    return args + worker_flags(version.worker)
