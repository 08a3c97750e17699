"""Stored responses: what `GET /v1/responses/{id}` returns and what `previous_response_id`
continues — the response object and its whole conversation (every earlier input and output item).

Bounded three ways: a time to live, a number of responses and a number of bytes; past either bound
the oldest go first. Two backends with one interface:
- `MemoryStore`: this process's (a lone coordinator);
- `SQLiteStore`: a file that every coordinator replica on the machine shares (`mindmotor up` and
  `coordinator --replicas` point theirs at one), so a follow-up may land on any replica. SQLite
  (Python's own `sqlite3`) serializes writers across processes with a file lock; each call opens
  its own connection in a thread, off the event loop, with a lock timeout."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections import OrderedDict
from contextlib import closing, contextmanager
from dataclasses import dataclass
from typing import Callable, Protocol

LOCK_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class StoreLimits:
    ttl_s: float = 3600.0
    max_responses: int = 1000
    max_bytes: int = 64 << 20


class ResponseStore(Protocol):
    async def get(self, response_id: str) -> dict | None: ...
    async def put(self, response_id: str, record: dict) -> None: ...
    async def delete(self, response_id: str) -> bool: ...


class MemoryStore:
    def __init__(self, limits: StoreLimits, clock: Callable[[], float] = time.monotonic):
        self.limits = limits
        self.clock = clock
        self._items: OrderedDict[str, tuple[float, str]] = OrderedDict()   # id -> (expires, JSON)
        self._bytes = 0

    async def get(self, response_id: str) -> dict | None:
        self._expire()
        entry = self._items.get(response_id)
        return json.loads(entry[1]) if entry is not None else None

    async def put(self, response_id: str, record: dict) -> None:
        text = json.dumps(record, separators=(",", ":"))
        await self.delete(response_id)
        self._items[response_id] = (self.clock() + self.limits.ttl_s, text)
        self._bytes += len(text)
        self._expire()
        while self._items and (len(self._items) > self.limits.max_responses or self._bytes > self.limits.max_bytes):
            self._drop(next(iter(self._items)))

    async def delete(self, response_id: str) -> bool:
        if response_id not in self._items:
            return False
        self._drop(response_id)
        return True

    def _drop(self, response_id: str) -> None:
        _, text = self._items.pop(response_id)
        self._bytes -= len(text)

    def _expire(self) -> None:
        now = self.clock()
        while self._items:
            oldest = next(iter(self._items))
            if self._items[oldest][0] > now:
                return
            self._drop(oldest)

    @property
    def size(self) -> tuple[int, int]:
        return len(self._items), self._bytes


class SQLiteStore:
    def __init__(self, path: str, limits: StoreLimits, clock: Callable[[], float] = time.time):
        self.path = path
        self.limits = limits
        self.clock = clock               # wall time: shared by processes
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, expires REAL NOT NULL, "
                       "size INTEGER NOT NULL, body TEXT NOT NULL)")
            db.execute("CREATE INDEX IF NOT EXISTS responses_expires ON responses (expires)")

    @contextmanager
    def _connect(self):
        with closing(sqlite3.connect(self.path, timeout=LOCK_TIMEOUT_S, isolation_level=None)) as db:
            yield db

    async def get(self, response_id: str) -> dict | None:
        return await asyncio.to_thread(self._get, response_id)

    async def put(self, response_id: str, record: dict) -> None:
        await asyncio.to_thread(self._put, response_id, json.dumps(record, separators=(",", ":")))

    async def delete(self, response_id: str) -> bool:
        return await asyncio.to_thread(self._delete, response_id)

    def _get(self, response_id: str) -> dict | None:
        with self._connect() as db:
            row = db.execute("SELECT body FROM responses WHERE id = ? AND expires > ?",
                             (response_id, self.clock())).fetchone()
        return json.loads(row[0]) if row else None

    def _put(self, response_id: str, text: str) -> None:
        now = self.clock()
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)",
                           (response_id, now + self.limits.ttl_s, len(text), text))
                db.execute("DELETE FROM responses WHERE expires <= ?", (now,))
                count, size = db.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM responses").fetchone()
                for oldest, oldest_size in db.execute("SELECT id, size FROM responses ORDER BY expires").fetchall():
                    if count <= self.limits.max_responses and size <= self.limits.max_bytes:
                        break
                    db.execute("DELETE FROM responses WHERE id = ?", (oldest,))
                    count, size = count - 1, size - oldest_size
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _delete(self, response_id: str) -> bool:
        with self._connect() as db:
            live = db.execute("DELETE FROM responses WHERE id = ? AND expires > ?", (response_id, self.clock())).rowcount
            db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
            return live > 0


def make_store(path: str | None, limits: StoreLimits) -> ResponseStore:
    return SQLiteStore(path, limits) if path else MemoryStore(limits)
