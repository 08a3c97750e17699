"""Where a platform's request time goes, from the coordinator's `/metrics`: per model and class,
the mean seconds of each phase (`mindmotor_request_phase_seconds`, which add up to the e2e
latency), its share, a p99 estimate per phase from the histogram's buckets, and vLLM's own split
(`vllm:request_queue/prefill/decode_time_seconds`) beside it. Over the totals since the coordinator
started, or over a window between two scrapes (what happens now, under load)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from mindmotor.common import vllm_metrics as V
from mindmotor.common.latency_phases import CLASS_LABEL, PHASE_LABEL, PHASE_METRIC, PHASES

VLLM_PHASES = {"queue": V.QUEUE_TIME, "prefill": V.PREFILL_TIME, "decode": V.DECODE_TIME}
SLO_METRIC = "mindmotor_slo_requests"          # {model_name, class, outcome}: met, missed_*


class MetricsError(Exception):
    """The metrics could not be read or do not hold what the analysis needs."""


@dataclass
class Histogram:
    count: float = 0.0
    sum: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)    # le -> cumulative count

    def minus(self, earlier: "Histogram") -> "Histogram":
        return Histogram(self.count - earlier.count, self.sum - earlier.sum,
                         {le: n - earlier.buckets.get(le, 0.0) for le, n in self.buckets.items()})

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count > 0 else 0.0

    def quantile(self, q: float) -> float:
        """Prometheus's histogram_quantile: linear within the bucket (the last finite bound when
        it falls in +Inf)."""
        if self.count <= 0:
            return 0.0
        rank, lower, below = q * self.count, 0.0, 0.0
        for le in sorted(self.buckets):
            n = self.buckets[le]
            if n >= rank:
                if math.isinf(le):
                    return lower
                return lower + (le - lower) * ((rank - below) / (n - below) if n > below else 1.0)
            lower, below = le, n
        return lower


Key = tuple[str, str]     # (model, class)


@dataclass
class Snapshot:
    """The histograms the analysis reads, by (model, class) and phase."""
    phases: dict[Key, dict[str, Histogram]] = field(default_factory=dict)
    vllm: dict[str, dict[str, Histogram]] = field(default_factory=dict)     # model -> vLLM phase -> histogram
    e2e: dict[str, Histogram] = field(default_factory=dict)                # model -> vllm:e2e
    slo: dict[Key, dict[str, float]] = field(default_factory=dict)          # (model, class) -> outcome -> count

    def minus(self, earlier: "Snapshot") -> "Snapshot":
        def sub(now: dict, then: dict) -> dict:
            out = {}
            for k, v in now.items():
                if isinstance(v, Histogram):
                    out[k] = v.minus(then[k]) if k in then else v
                elif isinstance(v, dict):
                    out[k] = sub(v, then.get(k, {}))
                else:
                    out[k] = v - then.get(k, 0.0)
            return out
        return Snapshot(sub(self.phases, earlier.phases), sub(self.vllm, earlier.vllm), sub(self.e2e, earlier.e2e),
                        sub(self.slo, earlier.slo))


def parse(text: str) -> Snapshot:
    snap = Snapshot()
    wanted = {PHASE_METRIC, V.E2E, *VLLM_PHASES.values()}
    by_metric = {v: k for k, v in VLLM_PHASES.items()}
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise MetricsError(f"not Prometheus text: {exc}") from None
    coordinator = False
    for family in families:
        coordinator |= family.name.startswith("mindmotor_coordinator_") or family.name == PHASE_METRIC
        if family.name == SLO_METRIC:
            for s in family.samples:
                if s.name.endswith("_total"):
                    key = (s.labels.get(V.LABEL, ""), s.labels.get(CLASS_LABEL, ""))
                    snap.slo.setdefault(key, {})[s.labels.get("outcome", "")] = s.value
        if family.name not in wanted:
            continue
        for s in family.samples:
            model = s.labels.get(V.LABEL, "")
            if family.name == PHASE_METRIC:
                key = (model, s.labels.get(CLASS_LABEL, ""))
                hist = snap.phases.setdefault(key, {}).setdefault(s.labels.get(PHASE_LABEL, ""), Histogram())
            elif family.name == V.E2E:
                hist = snap.e2e.setdefault(model, Histogram())
            else:
                hist = snap.vllm.setdefault(model, {}).setdefault(by_metric[family.name], Histogram())
            if s.name.endswith("_count"):
                hist.count = s.value
            elif s.name.endswith("_sum"):
                hist.sum = s.value
            elif s.name.endswith("_bucket"):
                hist.buckets[float(s.labels["le"])] = s.value
    if not coordinator:
        raise MetricsError("no mindmotor_coordinator_* series: is this a MindMotor coordinator's /metrics?")
    return snap


@dataclass
class PhaseRow:
    phase: str
    mean_s: float
    share: float          # of the mean e2e
    p99_s: float


@dataclass
class Breakdown:
    model: str
    slo_class: str
    requests: int
    mean_e2e_s: float
    phases: list[PhaseRow]                # largest mean first
    vllm_mean_s: dict[str, float]         # vLLM's queue / prefill / decode means (per model, every class)
    slo_met: float | None = None          # share of the class's finished choices that met its targets

    @property
    def top(self) -> str:
        return self.phases[0].phase if self.phases else ""

    def as_dict(self) -> dict:
        return {"model": self.model, "class": self.slo_class, "requests": self.requests,
                "mean_e2e_s": self.mean_e2e_s, "top_phase": self.top,
                "phases": [vars(p) for p in self.phases], "vllm_mean_s": self.vllm_mean_s,
                "slo_met": self.slo_met}


def breakdown(snap: Snapshot) -> list[Breakdown]:
    out = []
    for (model, slo_class), hists in sorted(snap.phases.items()):
        count = max((h.count for h in hists.values()), default=0.0)
        if count <= 0:
            continue
        total = sum(h.sum for h in hists.values()) / count
        rows = [PhaseRow(p, hists[p].mean, hists[p].mean / total if total > 0 else 0.0, hists[p].quantile(0.99))
                for p in PHASES if p in hists]
        rows.sort(key=lambda r: r.mean_s, reverse=True)
        vllm = {name: h.mean for name, h in snap.vllm.get(model, {}).items()}
        outcomes = snap.slo.get((model, slo_class), {})
        finished = sum(outcomes.values())
        met = outcomes.get("met", 0.0) / finished if finished > 0 else None
        out.append(Breakdown(model, slo_class, int(round(count)), total, rows, vllm, met))
    return out


def render(rows: list[Breakdown], top: int = 3) -> str:
    if not rows:
        return "no finished requests in the metrics (or in the window): nothing to break down"
    lines = []
    for b in rows:
        slo = f"  SLO met {b.slo_met:.1%}" if b.slo_met is not None else ""
        lines.append(f"model {b.model}  class {b.slo_class or '-'}  requests {b.requests}  "
                     f"mean e2e {b.mean_e2e_s * 1000:.1f} ms{slo}")
        lines.append(f"  {'phase':<14}{'mean ms':>10}{'share':>8}{'p99 ms':>10}")
        for r in b.phases:
            lines.append(f"  {r.phase:<14}{r.mean_s * 1000:>10.1f}{r.share:>8.1%}{r.p99_s * 1000:>10.1f}")
        lines.append("  top: " + ", ".join(f"{r.phase} {r.share:.0%}" for r in b.phases[:top]))
        lines.append("  (p99 from the histogram's buckets: vLLM's, 0.3 s at the low end)")
        if b.vllm_mean_s:
            lines.append("  vLLM's split (model): " + ", ".join(
                f"{k} {v * 1000:.1f} ms" for k, v in b.vllm_mean_s.items()))
    return "\n".join(lines)


def plot(rows: list[Breakdown], path: str) -> None:
    """A horizontal stacked bar per (model, class): mean seconds per phase."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{b.model} / {b.slo_class or '-'}" for b in rows]
    fig, ax = plt.subplots(figsize=(9, 2.0 + 0.6 * len(rows)))
    left = [0.0] * len(rows)
    for phase in PHASES:
        values = [next((r.mean_s * 1000 for r in b.phases if r.phase == phase), 0.0) for b in rows]
        ax.barh(labels, values, left=left, label=phase)
        left = [a + b for a, b in zip(left, values)]
    ax.set_xlabel("mean ms per request")
    ax.set_title("Where request time goes (mindmotor analyze latency)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45 if len(rows) < 3 else -0.2), ncol=len(PHASES),
              fontsize="small", frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
