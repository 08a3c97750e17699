"""`--search`: the fewest cards (and, with a P/D split, the P:D ratio) whose cluster meets an SLO
for a given share of requests at a given arrival rate. Larger clusters are tried in turn; at each
size every layout (all mixed, then each P:D split) is simulated on the same trace slice."""

from __future__ import annotations

from dataclasses import replace

from mindmotor.simulator.cluster import ClusterSpec
from mindmotor.simulator.report import SLO, summarize
from mindmotor.simulator.simulator import simulate
from mindmotor.simulator.trace import TraceRequest


def layouts(instances: int, pd: bool) -> list[tuple[int, int, int]]:
    """(mixed, prefill, decode) layouts of `instances` instances."""
    out = [(instances, 0, 0)]
    if pd:
        out += [(0, p, instances - p) for p in range(1, instances)]
    return out


def search(base: ClusterSpec, trace: list[TraceRequest], slo: SLO, target: float = 0.9,
           max_instances: int = 64, pd: bool = False) -> dict:
    tried = []
    for n in range(1, max_instances + 1):
        best = None
        for mixed, prefill, decode in layouts(n, pd):
            spec = replace(base, mixed=mixed, prefill=prefill, decode=decode)
            summary = summarize(simulate(spec, trace), slo)
            row = {"mixed": mixed, "prefill": prefill, "decode": decode, "cards": spec.cards,
                   "goodput_fraction": summary["goodput_fraction"],
                   "ttft_p90_s": summary["ttft_s"]["p90"], "tpot_p90_s": summary["tpot_s"]["p90"]}
            tried.append(row)
            if summary["goodput_fraction"] >= target and (
                    best is None or row["goodput_fraction"] > best["goodput_fraction"]):
                best = row
        if best is not None:
            return {"found": True, "best": best, "tried": tried}
    return {"found": False, "best": None, "tried": tried}
