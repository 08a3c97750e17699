"""Liveness of supervised services (`mindmotor up`'s, the replicas of `mindmotor coordinator
--replicas`): a process can be there and answer nothing (SIGSTOPped, its event loop stuck), which a
supervisor that only restarts dead children never notices.

Each service has an HTTP endpoint that its own server answers (coordinator `/health`, controller
admin `/health`, deployer `/metrics`); every `interval_s` the supervisor GETs it with a `timeout_s`
(in a thread: its loop never waits on a probe). Any HTTP answer is "alive" — a 503 (no worker
routable) is a readiness matter, not a reason to kill. `failures` probes in a row without an answer
→ SIGKILL, and the supervisor restarts the service as for any death (counted:
`mindmotor_up_liveness_kills_total{service}`). Off with `liveness: {enabled: false}`.

    probe = LivenessProbe(settings, url=lambda: "http://127.0.0.1:8000/health")
    probe.poll(now)      # True: the service has failed `failures` probes in a row: kill it
"""

from __future__ import annotations

import functools
import ssl
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import httpx
from pydantic import BaseModel, ConfigDict, Field

_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="liveness")


class LivenessSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    interval_s: float = Field(2.0, gt=0)      # between probes
    timeout_s: float = Field(3.0, gt=0)       # one probe's HTTP timeout
    failures: int = Field(3, ge=1)            # probes in a row without an answer before the kill


@functools.lru_cache(maxsize=16)
def _tls_context(verify: str | bool) -> ssl.SSLContext | bool:
    """One TLS context per CA file (or the system's), made once: building one loads and parses the
    CA bundle, which cost more CPU than the probe itself (a replica supervisor probing 4 replicas
    every 2 s spent ~0.1 of a core idle on it)."""
    if verify is False:
        return False
    return ssl.create_default_context(cafile=verify) if isinstance(verify, str) else ssl.create_default_context()


def answers(url: str, timeout_s: float, verify: str | bool = True) -> bool:
    """Any HTTP response in time (whatever its status); `verify`: the CA file for an https URL
    (a plain http URL needs none)."""
    context = _tls_context(verify) if url.startswith("https:") else False
    try:
        httpx.get(url, timeout=timeout_s, verify=context)
        return True
    except httpx.HTTPError:
        return False


class LivenessProbe:
    def __init__(self, settings: LivenessSettings, url: Callable[[], str],
                 verify: Callable[[], str | bool] = lambda: True):
        self.settings = settings
        self.url = url
        self.verify = verify
        self.misses = 0
        self.probes = 0                  # answered or not, since the start
        self._next = 0.0
        self._pending: Future | None = None

    def reset(self, now: float) -> None:
        """A (re)started service: probing starts `interval_s` after it is ready."""
        self.misses, self._pending, self._next = 0, None, now + self.settings.interval_s

    def poll(self, now: float) -> bool:
        if not self.settings.enabled:
            return False
        if self._pending is not None:
            if not self._pending.done():
                return False
            ok, self._pending = self._pending.result(), None
            self.probes += 1
            self.misses = 0 if ok else self.misses + 1
            if self.misses >= self.settings.failures:
                return True
        if now >= self._next:
            self._next = now + self.settings.interval_s
            self._pending = _POOL.submit(answers, self.url(), self.settings.timeout_s, self.verify())
        return False
