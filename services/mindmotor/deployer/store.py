"""`DeploymentStore`: the deployment records in the project's `Store` (memory, or Redis so that a
restarted deployer recovers every deployment), changed only by compare-and-set so that an API
call and the reconcile loop never overwrite each other's write.

Layout under the deployer's store prefix (`<redis prefix>deployer:`): hash `deployments`
(deployment name → record JSON).
"""

from __future__ import annotations

from typing import Callable

from mindmotor.common.store import Store

from .records import DeploymentRecord

DEPLOYMENTS = "deployments"
MAX_ATTEMPTS = 50
REMOVE = object()    # returned by a change function: delete the record


class StoreConflict(RuntimeError):
    """A record kept changing under an update."""


class DeploymentStore:
    def __init__(self, store: Store):
        self.store = store

    async def list(self) -> list[DeploymentRecord]:
        raw = await self.store.hgetall(DEPLOYMENTS)
        return sorted((DeploymentRecord.from_dict(v) for v in raw.values()), key=lambda r: r.name)

    async def get(self, name: str) -> DeploymentRecord | None:
        raw = await self.store.hget(DEPLOYMENTS, name)
        return None if raw is None else DeploymentRecord.from_dict(raw)

    async def create(self, record: DeploymentRecord) -> bool:
        """Write a new record; False if one of that name exists."""
        return await self.store.hcompare_and_set(DEPLOYMENTS, record.name, None, record.to_dict())

    async def update(self, name: str, change: Callable[[DeploymentRecord], object]) -> DeploymentRecord | None:
        """Apply `change` to the stored record (it may raise to refuse) and write it back if nobody
        wrote in between (else retry on the fresh record). The record after the change; None if
        there is no such record or the change removed it."""
        for _ in range(MAX_ATTEMPTS):
            raw = await self.store.hget(DEPLOYMENTS, name)
            if raw is None:
                return None
            record = DeploymentRecord.from_dict(raw)
            result = change(record)
            new_raw = None if result is REMOVE else record.to_dict()
            if new_raw == raw or await self.store.hcompare_and_set(DEPLOYMENTS, name, raw, new_raw):
                return None if result is REMOVE else record
        raise StoreConflict(f"deployment {name} kept changing")
