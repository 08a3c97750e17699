"""Canary analysis (as Flagger and Argo Rollouts do it): while a rollout is in its canary phase,
its new version is compared with the version it replaces on the figures the coordinators count
per (model, version) — requests, errors, and the time-to-first-token histogram — over a sliding
window of the canary phase. Pure: the figures come from `coordinator_metrics.py`, the verdict goes
to the reconcile loop, which rolls a failed canary back with the verdict's reason.

A canary fails when, with at least `min_requests` of its own in the window,

    its error rate  > the previous version's + max_error_rate_increase        (absolute), or
    its p90 TTFT    > the previous version's × (1 + max_ttft_p90_increase)    (relative; judged
                      only when the previous version has `min_requests` in the window too).

Until then it passes ("waiting"); nothing is promoted automatically.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class AnalysisSettings:
    enabled: bool = True
    max_error_rate_increase: float = 0.05      # < 0: errors not judged
    max_ttft_p90_increase: float = 0.5         # < 0: TTFT not judged
    window_s: float = 60.0
    min_requests: int = 20

    def __post_init__(self):
        if not self.window_s > 0:
            raise ValueError(f"analysis window must be positive, got {self.window_s:g} s")
        if self.min_requests < 1:
            raise ValueError(f"analysis min_requests must be at least 1, got {self.min_requests}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> "AnalysisSettings":
        return cls(**data) if data else cls(enabled=False)

    def overridden(self, max_error_rate_increase: float = 0.0, max_ttft_p90_increase: float = 0.0,
                   window_s: float = 0.0, min_requests: int = 0) -> "AnalysisSettings":
        """These settings with every non-zero value given replacing the default."""
        given = {"max_error_rate_increase": max_error_rate_increase, "max_ttft_p90_increase": max_ttft_p90_increase,
                 "window_s": window_s, "min_requests": min_requests}
        return replace(self, **{k: v for k, v in given.items() if v})


@dataclass(frozen=True)
class Figures:
    """One version's counts over a window: requests, errors, and the TTFT histogram as cumulative
    bucket counts (upper bound in seconds -> observations at most that; +inf last)."""
    requests: float = 0.0
    errors: float = 0.0
    ttft_buckets: tuple[tuple[float, float], ...] = ()

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests > 0 else 0.0

    def ttft_quantile(self, q: float) -> float | None:
        """The q-quantile of TTFT, interpolated linearly within its bucket (Prometheus'
        histogram_quantile); None without observations. In the +inf bucket: the last finite bound."""
        if not self.ttft_buckets or self.ttft_buckets[-1][1] <= 0:
            return None
        total = self.ttft_buckets[-1][1]
        rank = q * total
        lower_bound, lower_count = 0.0, 0.0
        for bound, count in self.ttft_buckets:
            if count >= rank:
                if math.isinf(bound):
                    return lower_bound
                if count == lower_count:
                    return bound
                return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
            lower_bound, lower_count = bound, count
        return lower_bound

    def describe(self) -> str:
        p90 = self.ttft_quantile(0.9)
        latency = f", p90 TTFT {p90:.3g} s" if p90 is not None else ""
        return f"{self.requests:g} requests, {self.errors:g} errors ({100 * self.error_rate:.1f}%){latency}"


@dataclass(frozen=True)
class Verdict:
    failed: bool
    summary: str             # the figures and what was decided, for the operator


def judge(settings: AnalysisSettings, canary: str, canary_figures: Figures, previous: str,
          previous_figures: Figures, window_s: float) -> Verdict:
    """Whether the canary has failed against the previous version over the window (`window_s`:
    how many seconds the figures cover)."""
    seen = (f"over the last {window_s:.0f} s: {canary} {canary_figures.describe()}; "
            f"{previous} {previous_figures.describe()}")
    if canary_figures.requests < settings.min_requests:
        return Verdict(False, f"waiting for {settings.min_requests} requests to {canary} ({seen})")
    if settings.max_error_rate_increase >= 0:
        limit = previous_figures.error_rate + settings.max_error_rate_increase
        if canary_figures.error_rate > limit:
            return Verdict(True, f"error rate of {canary} {100 * canary_figures.error_rate:.1f}% exceeds "
                                 f"{previous}'s {100 * previous_figures.error_rate:.1f}% by more than the margin of "
                                 f"{100 * settings.max_error_rate_increase:.1f} points ({seen})")
    if settings.max_ttft_p90_increase >= 0 and previous_figures.requests >= settings.min_requests:
        mine, theirs = canary_figures.ttft_quantile(0.9), previous_figures.ttft_quantile(0.9)
        if mine is not None and theirs is not None and mine > theirs * (1 + settings.max_ttft_p90_increase):
            return Verdict(True, f"p90 TTFT of {canary} {mine:.3g} s exceeds {previous}'s {theirs:.3g} s by more "
                                 f"than the margin of {100 * settings.max_ttft_p90_increase:.0f}% ({seen})")
    return Verdict(False, f"passing ({seen})")
