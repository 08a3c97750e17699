"""What a simulation run reports: latency percentiles, goodput under SLOs, utilization, KV usage."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mindmotor.simulator.simulator import SimulationResult

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class SLO:
    ttft_s: float | None = None
    tpot_s: float | None = None

    def met(self, ttft: np.ndarray, tpot: np.ndarray) -> np.ndarray:
        ok = np.ones(len(ttft), dtype=bool)
        if self.ttft_s is not None:
            ok &= ttft <= self.ttft_s
        if self.tpot_s is not None:
            ok &= np.nan_to_num(tpot, nan=0.0) <= self.tpot_s
        return ok


def _pcts(values: np.ndarray) -> dict[str, float]:
    if len(values) == 0:
        return {f"p{q}": None for q in PERCENTILES} | {"mean": None}
    return {f"p{q}": float(np.percentile(values, q)) for q in PERCENTILES} | {"mean": float(values.mean())}


def summarize(result: SimulationResult, slo: SLO = SLO()) -> dict:
    reqs = result.requests
    arrival = np.array([r.arrival_s for r in reqs])
    first = np.array([r.first_token_s for r in reqs])
    done = np.array([r.finished_s for r in reqs])
    outputs = np.array([r.output_tokens for r in reqs])
    ttft, e2e = first - arrival, done - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(outputs > 1, (done - first) / (outputs - 1), np.nan)
    met = slo.met(ttft, tpot)
    span = result.makespan_s
    instances = [{"instance": x.index, "role": x.role, "utilization": x.busy_s / span if span else 0.0,
                  "kv_usage_mean": x.kv_usage_time / x.busy_s if x.busy_s else 0.0,
                  "kv_usage_peak": x.kv_usage_peak, "kv_blocks": x.kv_plan.num_blocks,
                  "steps": x.steps, "preemptions": x.scheduler.num_preemptions,
                  "prefix_queries": x.block_manager.prefix_queries, "prefix_hits": x.block_manager.prefix_hits,
                  "kv_tier_hits": x.engine.kv_tier.stats.hits if x.engine.kv_tier is not None else 0}
                 for x in result.instances]
    return {
        "cluster": {"instances": result.spec.instances, "cards": result.spec.cards,
                    "roles": {"mixed": result.spec.mixed, "prefill": result.spec.prefill,
                              "decode": result.spec.decode},
                    "device": result.spec.device, "model": result.spec.model, "tp": result.spec.tp,
                    "routing": result.spec.routing},
        "requests": len(reqs), "clipped_requests": result.clipped,
        "output_tokens": int(outputs.sum()),
        "emulated_makespan_s": span, "wall_s": result.wall_s,
        "throughput_tokens_per_s": float(outputs.sum() / span) if span else 0.0,
        "ttft_s": _pcts(ttft), "tpot_s": _pcts(tpot[~np.isnan(tpot)]),
        "itl_s": _pcts(np.frombuffer(result.itl_s, dtype=np.float64)), "e2e_s": _pcts(e2e),
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s},
        "goodput_fraction": float(met.mean()), "goodput_req_per_s": float(met.sum() / span) if span else 0.0,
        "utilization_mean": float(np.mean([i["utilization"] for i in instances])),
        "kv_usage_mean": float(np.mean([i["kv_usage_mean"] for i in instances])),
        "kv_usage_peak": float(max(i["kv_usage_peak"] for i in instances)),
        "preemptions": int(sum(i["preemptions"] for i in instances)),
        # of the prompt tokens looked up at admission: hit in HBM's prefix cache, loaded from the host tier
        "prefix_hit_rate": _share(sum(i["prefix_hits"] for i in instances), instances),
        "kv_tier_hit_rate": _share(sum(i["kv_tier_hits"] for i in instances), instances),
        "handoffs": result.handoffs,
        "kv_transfer_s_total": result.kv_transfer_s,
        "instances": instances,
    }


def _share(tokens: int, instances: list[dict]) -> float:
    queries = sum(i["prefix_queries"] for i in instances)
    return tokens / queries if queries else 0.0
