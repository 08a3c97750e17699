"""Where a service listens, and what that demands: standalone services bind 127.0.0.1 unless told
otherwise, and an admin endpoint bound beyond loopback refuses to start without a token.

    require_admin_token("the controller admin API", "0.0.0.0", token=None)
    # ValueError: the controller admin API listens on 0.0.0.0 (beyond loopback) without an admin token ...
"""

from __future__ import annotations

import ipaddress

DEFAULT_HOST = "127.0.0.1"
ALLOW_OPEN_FLAG = "--allow-open-admin"


def is_loopback(host: str) -> bool:
    """Whether `host` reaches this machine only (127.0.0.0/8, ::1, localhost); a wildcard
    (0.0.0.0, ::, empty) or any other name or address is beyond loopback."""
    host = (host or "").strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_api_warning(host: str, keys_enabled: bool) -> str | None:
    """The start-up warning for an OpenAI API served without API keys beyond loopback (anyone who
    reaches the port may use it); None when keys are set or the API listens on loopback only."""
    if keys_enabled or is_loopback(host):
        return None
    return (f"the API listens on {host} (beyond loopback) without API keys: anyone who reaches it can use "
            f"it; set MINDMOTOR_API_KEYS or --api-key-file FILE, or bind 127.0.0.1")


def require_admin_token(what: str, host: str, token: str | None, allow_open: bool = False) -> None:
    """ValueError (the start-up error) when `what` would listen beyond loopback with no token,
    unless `allow_open` (the operator's explicit `--allow-open-admin`)."""
    if token or allow_open or is_loopback(host):
        return
    raise ValueError(
        f"{what} listens on {host} (beyond loopback) without an admin token: give one "
        f"(MINDMOTOR_ADMIN_TOKEN or --admin-token-file FILE), bind 127.0.0.1, or pass "
        f"{ALLOW_OPEN_FLAG} to run it open on purpose")


def add_admin_arguments(parser, what: str, flags=None) -> None:
    """The admin-token flags of a service whose `what` ("the admin API", "every Deployer call", ...)
    an admin token guards: the file (recommended), the value (discouraged), and the explicit
    opt-out for running open beyond loopback. With `flags` (common/settings.Flags) they set the
    service's `admin_token_file`, `admin_token` and `allow_open_admin` settings."""
    add = flags.add if flags is not None else (lambda group, *names, **kwargs: group.add_argument(*names, **kwargs))
    add(parser, "--admin-token-file", default=None, metavar="FILE",
        help=f"file holding the bearer token {what} must carry (default: "
             "$MINDMOTOR_ADMIN_TOKEN; none: open, allowed on loopback only)")
    add(parser, "--admin-token", default=None, help="the token itself (discouraged: visible in the "
                                                    "process list; use $MINDMOTOR_ADMIN_TOKEN or the file)")
    add(parser, ALLOW_OPEN_FLAG, action="store_true", default=None if flags is not None else False,
        help="serve beyond loopback without a token (default: refuse to start)")
