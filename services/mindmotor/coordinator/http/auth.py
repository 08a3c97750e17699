"""`APIKeys`: the configured keys, kept only as SHA-256 digests; a presented key is hashed and
compared with every digest in constant time (`hmac.compare_digest`), so neither the keys nor the
time a comparison takes reveal anything. No keys configured: auth is off.

Keys come from the settings (`MINDMOTOR_API_KEYS`, flags) and from a key file (`api_key_file`, one
a line). The file is re-read when it changes (checked at most once per `RELOAD_CHECK_S`), so keys
are rotated by editing it — no restart: add the new key, move the clients, remove the old one.
A file that becomes unreadable or empty keeps the keys it last held (auth never turns itself off).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import time
from typing import Callable, Iterable

from mindmotor.coordinator.http.errors import Unauthorized

log = logging.getLogger("mindmotor.coordinator.http.auth")

RELOAD_CHECK_S = 1.0


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class APIKeys:
    def __init__(self, keys: Iterable[str], key_file: str | os.PathLike | None = None,
                 on_reload: Callable[[str], None] | None = None, reload_check_s: float = RELOAD_CHECK_S):
        """ValueError when `key_file` cannot be read or holds no key (at start-up: a clear error)."""
        self._static = [digest(k) for k in keys if k]
        self._file = os.fspath(key_file) if key_file else None
        self._on_reload = on_reload or (lambda outcome: None)
        self._reload_check_s = reload_check_s
        self._lock = threading.Lock()
        self._file_digests: list[bytes] = []
        self._stamp: tuple | None = None
        self._next_check = 0.0
        if self._file:
            self._stamp = self._file_stamp()
            self._file_digests = self._read_file()
        self._digests = self._static + self._file_digests

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def check(self, authorization: str | None) -> str:
        """The caller's identity (the hex digest of its key) from an `Authorization` header value;
        Unauthorized when the key is missing or wrong."""
        if self._file:
            self._maybe_reload()
        scheme, _, key = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Unauthorized("missing API key: send 'Authorization: Bearer <key>'", code="missing_api_key")
        presented = digest(key.strip())
        found = False
        for known in self._digests:
            found |= hmac.compare_digest(presented, known)
        if not found:
            raise Unauthorized("incorrect API key", code="invalid_api_key")
        return presented.hex()

    # ---- the key file ------------------------------------------------------------------------
    def _read_file(self) -> list[bytes]:
        from mindmotor.common.secrets import secret_list

        return [digest(k) for k in secret_list("API keys", file=self._file)]

    def _file_stamp(self) -> tuple | None:
        try:
            st = os.stat(self._file)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _maybe_reload(self) -> None:
        now = time.monotonic()
        if now < self._next_check:
            return
        with self._lock:
            if now < self._next_check:
                return
            self._next_check = now + self._reload_check_s
            stamp = self._file_stamp()
            if stamp == self._stamp:
                return
            self._stamp = stamp
            try:
                digests = self._read_file()
            except ValueError as exc:
                log.warning("API key file not reloaded; the previous keys stay valid", extra={"error": str(exc)})
                self._on_reload("kept")
                return
            self._file_digests = digests
            self._digests = self._static + digests
            log.info("API key file reloaded", extra={"keys": len(self._digests)})
            self._on_reload("reloaded")
