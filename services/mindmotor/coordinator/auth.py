"""`APIKeys`: the configured keys, kept only as SHA-256 digests; a presented key is hashed and
compared with every digest in constant time (`hmac.compare_digest`), so neither the keys nor the
time a comparison takes reveal anything. No keys configured: auth is off."""

from __future__ import annotations

import hashlib
import hmac
from typing import Iterable

from .errors import Unauthorized


def digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class APIKeys:
    def __init__(self, keys: Iterable[str]):
        self._digests = [digest(k) for k in keys if k]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def check(self, authorization: str | None) -> str:
        """The caller's identity (the hex digest of its key) from an `Authorization` header value;
        Unauthorized when the key is missing or wrong."""
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
