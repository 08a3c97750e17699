"""`FileStore`: a `MemoryStore` whose hashes and lasting values are also written to one JSON file
after every change (atomically: a temporary file renamed over it) and read back when it opens — the
state of one process that must survive its restart without a Redis (the deployer `mindmotor up`
starts keeps its deployments in `<state dir>/deployer-store.json`).

    store = open_store("file:/var/lib/mindmotor/deployer-store.json", prefix="mindmotor:deployer:")

One process at a time: nothing coordinates two writers of a file (`mindmotor up` holds its state
directory's lock for it). What expires is not written — leases and values with a TTL live on the
process's monotonic clock and mean nothing to the next process. Notifications (publish/subscribe)
stay within the process, as with `MemoryStore`. A change is on disk when the call returns; an
unreadable file is refused at open (`ValueError` naming it) rather than taken for an empty store.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .store import DEFAULT_PREFIX, MemoryStore

FORMAT = 1


class FileStore(MemoryStore):
    kind = "file"

    def __init__(self, path: str | Path, prefix: str = DEFAULT_PREFIX):
        super().__init__(prefix)
        self.path = Path(path)
        self._load()

    def _load(self) -> None:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return
        try:
            data = json.loads(text)
            if data.get("format") != FORMAT or data.get("prefix") != self.prefix:
                raise ValueError(f"format {data.get('format')!r}, prefix {data.get('prefix')!r}")
            self._hashes = {key: {f: str(t) for f, t in fields.items()} for key, fields in data["hashes"].items()}
            self._values = {key: (str(text), None) for key, text in data["values"].items()}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{self.path}: not a store file of this prefix ({exc}); move it away to start "
                             "with an empty store") from None

    def _save(self) -> None:
        lasting = {key: text for key, (text, expires) in self._values.items() if expires is None}
        data = {"format": FORMAT, "prefix": self.prefix, "hashes": self._hashes, "values": lasting}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            json.dump(data, f, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    # every change of a hash or of a value without a TTL is written through
    async def set(self, key, value, ttl_s=None):
        await super().set(key, value, ttl_s)
        if ttl_s is None:
            self._save()

    async def delete(self, key):
        existed = await super().delete(key)
        self._save()
        return existed

    async def incr(self, key, amount=1):
        value = await super().incr(key, amount)
        self._save()
        return value

    async def hset(self, key, field, value):
        await super().hset(key, field, value)
        self._save()

    async def hdel(self, key, field):
        existed = await super().hdel(key, field)
        if existed:
            self._save()
        return existed

    async def clear(self):
        count = await super().clear()
        self._save()
        return count
