"""Redaction: the one place secrets are taken out of text before it leaves the process (a log
line, an HTTP error body, a gRPC status's details).

    redact("redis at redis://:hunter2@10.0.0.3:6379/0: ConnectionError")
    # 'redis at redis://:***@10.0.0.3:6379/0: ConnectionError'
    register_secret(admin_token)        # from now on, the token itself is masked in any text
    redact_value({"error": exc, "urls": [url]})   # the same over a structure (log `extra` fields)

Two things are masked: the password of every URL (`scheme://user:PASSWORD@host`, and a
`password=`/`token=` query parameter), and every registered secret value (API keys, admin tokens,
Redis passwords: the services register what they read from the environment or their files), so a
secret that reaches a message by another path is masked too.
"""

from __future__ import annotations

import re
import threading
from typing import Any

MASK = "***"
MIN_SECRET_LEN = 4            # shorter registered values would mask ordinary words

# `scheme://[user]:password@`: the password runs to the last `@` before the host (a raw `@` in a
# password is taken as part of it; over-masking is harmless, under-masking is not).
_URL_USERINFO = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s:/@'\"]*):(?P<password>[^\s/'\"]*)@")
_QUERY_SECRET = re.compile(r"(?P<head>[?&](?:password|passwd|pwd|token|api_key|apikey)=)[^&\s'\"]+",
                           re.IGNORECASE)

_lock = threading.Lock()
_secrets: frozenset[str] = frozenset()


def register_secret(value: str | None) -> None:
    """Mask `value` wherever it appears in redacted text from now on (this process)."""
    global _secrets
    if value and len(value) >= MIN_SECRET_LEN:
        with _lock:
            _secrets = _secrets | {value}


def register_url(url: str | None) -> None:
    """Register the password of `url` (e.g. a Redis URL), whether or not it is ever printed whole."""
    if not url:
        return
    from urllib.parse import unquote, urlsplit

    try:
        password = urlsplit(url).password
    except ValueError:
        return
    if password:
        register_secret(password)
        register_secret(unquote(password))


def redact(text: str) -> str:
    """`text` with URL passwords and registered secrets replaced by `***`."""
    if not text:
        return text
    text = _URL_USERINFO.sub(lambda m: f"{m['head']}:{MASK}@", text)
    text = _QUERY_SECRET.sub(lambda m: f"{m['head']}{MASK}", text)
    for secret in sorted(_secrets, key=len, reverse=True):   # longest first: one secret may contain another
        if secret in text:
            text = text.replace(secret, MASK)
    return text


_PLAIN = (int, float, bool, type(None))


def redact_value(value: Any) -> Any:
    """`value` with every string in it redacted (dicts, lists and tuples walked); any other object
    becomes its redacted `str()` if that shows a secret, else it is returned as it is."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, dict):
        return {k: redact_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [redact_value(v) for v in value]
    text = str(value)
    masked = redact(text)
    return masked if masked != text else value
