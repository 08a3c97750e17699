"""Secrets from the environment or from files, never needing the command line (where every local
user reads them in /proc/PID/cmdline and `ps`).

    token = secret("admin token", flag=args.admin_token, file=args.admin_token_file,
                   env="MINDMOTOR_ADMIN_TOKEN")
    keys = secret_list("API keys", values=args.api_key, file=args.api_key_file, env="MINDMOTOR_API_KEYS")

Precedence: the file, then the value (a flag kept for compatibility, discouraged; or a setting
that already came from the environment), then the environment variable. A file holds the secret on its first non-empty line (`secret`) or one per
line (`secret_list`; blank lines and `#` comments skipped). Every value read is registered with
`redact`, so it is masked in logs and error bodies from then on. ValueError (naming the file, never
its content) for a missing or empty file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

from .redact import register_secret, register_url

ADMIN_TOKEN_ENV = "MINDMOTOR_ADMIN_TOKEN"
API_KEYS_ENV = "MINDMOTOR_API_KEYS"
REDIS_URL_ENV = "MINDMOTOR_REDIS_URL"


def read_lines(what: str, path: str | os.PathLike) -> list[str]:
    """The non-empty, non-comment lines of a secret file, stripped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read the {what} file {path}: {exc.strerror or type(exc).__name__}") from None
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    if not lines:
        raise ValueError(f"the {what} file {path} is empty")
    return lines


def _register(value: str) -> str:
    """Mask `value` from now on; of a URL only its password (a URL without one is no secret)."""
    if "://" in value:
        register_url(value)
    else:
        register_secret(value)
    return value


def secret(what: str, flag: str | None = None, file: str | os.PathLike | None = None,
           env: str | None = None) -> str | None:
    """One secret (a token, a URL): the first line of `file`, else `flag`, else `$env`;
    None when none is given."""
    if file:
        return _register(read_lines(what, file)[0])
    if flag and flag.strip():
        return _register(flag.strip())
    value = (os.environ.get(env) or "").strip() if env else ""
    return _register(value) if value else None


def secret_list(what: str, values: Iterable[str] | None = None, file: str | os.PathLike | None = None,
                env: str | None = None) -> list[str]:
    """Several secrets (API keys): those of `values` and every line of `file`; `$env`
    (comma-separated) only when neither is given."""
    found = [v.strip() for v in (values or []) if v and v.strip()]
    if file:
        found += read_lines(what, file)
    if not found and env:
        found = [v.strip() for v in os.environ.get(env, "").split(",") if v.strip()]
    for value in found:
        _register(value)
    return found
