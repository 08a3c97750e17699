"""A store's epoch: a random id written once into a store that has none (hash `store`, field
`epoch`, under the store's prefix). A Redis restarted without its data (or flushed) comes back
without it, so a new epoch — or none where there was one — means the store lost its data; a
service that sees that must not take the empty store for "nothing should run".

    epoch, created = await store_epoch(store)

The one mechanism for it: the controller's registry reads its epoch here (and holds on to its last
good routing table across such a reset; the deployer keeps its replicas: deployer/reconcile.py).
"""

from __future__ import annotations

import uuid

from .store import Store

STORE_HASH, EPOCH_FIELD = "store", "epoch"


async def store_epoch(store: Store) -> tuple[str, bool]:
    """(the store's epoch, whether this call wrote it: the store had none)."""
    current = await store.hget(STORE_HASH, EPOCH_FIELD)
    if current is not None:
        return current, False
    candidate = uuid.uuid4().hex
    if await store.hcompare_and_set(STORE_HASH, EPOCH_FIELD, None, candidate):
        return candidate, True
    return await store.hget(STORE_HASH, EPOCH_FIELD), False
