"""`CoordinatorFigures`: the per-version request figures of every coordinator, read from their
Prometheus endpoints (`GET /metrics`, the `mindmotor_coordinator_version_*` series), summed over
the coordinators and differenced over a window — what canary analysis judges.

The coordinators are the only place that sees a request's outcome as the client does (a 400
from a worker, a stream cut after a failure, the time to the first token including routing and
queueing), so the deployer asks them, not the workers. Each read is one GET per coordinator
(bounded by `timeout_s`); a coordinator that does not answer is left out of that sample and
logged. Samples are kept per coordinator, so that a coordinator that restarted (its request
counter below the window's first sample) counts from 0 rather than negatively.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from .analysis import Figures

log = logging.getLogger("mindmotor.deployer")

REQUESTS = "mindmotor_coordinator_version_requests"
ERRORS = "mindmotor_coordinator_version_errors"
TTFT = "mindmotor_coordinator_version_time_to_first_token_seconds"

Key = tuple[str, str]                                 # (model, version)


@dataclass
class Totals:
    """One coordinator's counters at one moment, per (model, version)."""
    requests: dict[Key, float] = field(default_factory=dict)
    errors: dict[Key, float] = field(default_factory=dict)
    buckets: dict[Key, dict[float, float]] = field(default_factory=dict)


def parse_totals(text: str) -> Totals:
    totals = Totals()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if "model" not in labels or "version" not in labels:
                continue
            key = (labels["model"], labels["version"])
            if sample.name == REQUESTS + "_total":
                totals.requests[key] = sample.value
            elif sample.name == ERRORS + "_total":
                totals.errors[key] = sample.value
            elif sample.name == TTFT + "_bucket":
                totals.buckets.setdefault(key, {})[float(labels["le"])] = sample.value
    return totals


class CoordinatorFigures:
    def __init__(self, urls: list[str], timeout_s: float = 2.0, clock: Callable[[], float] = time.time,
                 keep_s: float = 3600.0, on_read: Callable[[str], None] = lambda outcome: None):
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout_s = timeout_s
        self.clock = clock
        self.keep_s = keep_s
        self.on_read = on_read                      # "ok" | "failed", per coordinator read
        self._samples: dict[str, list[tuple[float, Totals]]] = defaultdict(list)   # url -> (time, totals)
        self._client: httpx.AsyncClient | None = None
        self.failures = 0

    @property
    def enabled(self) -> bool:
        return bool(self.urls)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def sample(self) -> None:
        """Read every coordinator once (concurrently)."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        await asyncio.gather(*(self._sample_one(url) for url in self.urls))

    async def _sample_one(self, url: str) -> None:
        try:
            response = await self._client.get(f"{url}/metrics")
            response.raise_for_status()
            totals = parse_totals(response.text)
        except (httpx.HTTPError, ValueError) as exc:
            self.failures += 1
            self.on_read("failed")
            log.warning("coordinator metrics not read", extra={"url": url, "error": f"{type(exc).__name__}: {exc}"})
            return
        self.on_read("ok")
        now = self.clock()
        samples = self._samples[url]
        samples.append((now, totals))
        while len(samples) > 2 and samples[1][0] < now - self.keep_s:
            samples.pop(0)

    def window(self, model: str, versions: list[str], since: float, window_s: float) -> tuple[dict[str, Figures], float]:
        """Each version's figures over the last `window_s` seconds, not before `since` (the canary
        began), summed over the coordinators; and the seconds the figures actually cover."""
        now = self.clock()
        start = max(since, now - window_s)
        out = {v: Figures() for v in versions}
        covered = 0.0
        for samples in self._samples.values():
            usable = [s for s in samples if s[0] >= since]
            if len(usable) < 2:
                continue
            base = next((s for s in reversed(usable) if s[0] <= start), usable[0])
            latest = usable[-1]
            if latest is base:
                continue
            covered = max(covered, latest[0] - base[0])
            for version in versions:
                key = (model, version)
                old, new = base[1], latest[1]
                if new.requests.get(key, 0.0) < old.requests.get(key, 0.0):
                    old = Totals()                   # the coordinator restarted: its counters began again at 0
                figures = out[version]
                merged = dict(figures.ttft_buckets)
                for bound, count in new.buckets.get(key, {}).items():
                    merged[bound] = merged.get(bound, 0.0) + max(0.0, count - old.buckets.get(key, {}).get(bound, 0.0))
                out[version] = Figures(
                    requests=figures.requests + new.requests.get(key, 0.0) - old.requests.get(key, 0.0),
                    errors=figures.errors + max(0.0, new.errors.get(key, 0.0) - old.errors.get(key, 0.0)),
                    ttft_buckets=tuple(sorted(merged.items(), key=lambda kv: (math.isinf(kv[0]), kv[0]))))
        return out, covered
