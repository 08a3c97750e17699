"""The role a worker serves as, and switching it at run time.

Roles: `prefill` (runs prompts, pins their KV for decode instances), `decode` (continues requests
prefilled elsewhere), `mixed` (both in one engine). The role tells routers what to send where; the
worker itself serves every RPC whatever its role, so a request routed before a switch still works.

A switch drains first: new requests are refused (the worker reports "draining", so routers move
away), in-flight ones finish (bounded by a timeout), the role changes, requests are taken again.
Switches are serialized.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from .admission import Admission

from mindmotor.common.roles import Role

log = logging.getLogger("mindmotor.worker")


class RoleSwitch:
    def __init__(self, admission: Admission, role: Role | str, drain_timeout_s: float = 30.0):
        self.admission = admission
        self.role = Role.parse(role)
        self.drain_timeout_s = drain_timeout_s
        self.switching = False
        self._lock = asyncio.Lock()
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        """Called when the reported state or role changes (e.g. to heartbeat at once)."""
        self._listeners.append(listener)

    async def switch(self, role: Role | str, drain_timeout_s: float | None = None) -> tuple[Role, bool]:
        """Serve as `role` from now on; returns (previous role, whether in-flight work drained)."""
        role = Role.parse(role)
        async with self._lock:
            previous = self.role
            if role == previous:
                return previous, True
            timeout = drain_timeout_s or self.drain_timeout_s
            log.info("role switch: draining", extra={"from": previous, "to": role,
                                                      "in_flight": len(self.admission.in_flight)})
            self.switching = True
            self.admission.pause()
            self._notify()
            try:
                drained = await self.admission.wait_idle(timeout)
            finally:
                self.role = role
                self.admission.resume()
                self.switching = False
                self._notify()
            log.info("role switched", extra={"from": previous, "to": role, "drained": drained})
            return previous, drained

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()
