"""The admin token on gRPC: metadata `authorization: Bearer <token>`, compared in constant time.

    ok = bearer_matches(context.invocation_metadata(), token)     # common.rpc's interceptor: the admin role
    stub.Apply(request, metadata=bearer_metadata(token))          # the caller's side

Which methods need the admin role is each service's policy in common/rpc.py; the standard health
service stays open, so probes (Kubernetes, load balancers) need no token.
"""

from __future__ import annotations

import hmac
from typing import Iterable


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def bearer_matches(metadata: Iterable[tuple[str, str]] | None, token: str) -> bool:
    """Whether the call's metadata carries `authorization: Bearer <token>`."""
    header = next((value for key, value in (metadata or ()) if key.lower() == "authorization"), "")
    scheme, _, given = str(header).partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
