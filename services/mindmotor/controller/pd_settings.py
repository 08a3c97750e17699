"""`PDAutoscaleSettings`: whether the leader runs the P/D ratio policy, against which SLO targets
(a default, and per deployment or per model), with which hysteresis, and how often.

    --pd-autoscale --pd-ttft-slo-ms 1000 --pd-tpot-slo-ms 50
    --pd-slo deployment=chat,ttft_ms=500,tpot_ms=40      # repeatable; or model=NAME,...
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .pd_ratio import SLO, RatioPolicyConfig

DEFAULT_SLO = SLO(ttft_s=1.0, tpot_s=0.05)


@dataclass(frozen=True)
class PDAutoscaleSettings:
    enabled: bool = False
    default_slo: SLO = DEFAULT_SLO
    # ("deployment" | "model", name) -> SLO; a deployment's entry wins over its model's
    slos: dict[tuple[str, str], SLO] = field(default_factory=dict)
    policy: RatioPolicyConfig = RatioPolicyConfig()
    every_heartbeats: int = 3               # evaluate every this many heartbeat intervals

    def __post_init__(self):
        if self.every_heartbeats < 1:
            raise ValueError(f"the P/D evaluation period must be at least 1 heartbeat, got {self.every_heartbeats}")
        p = self.policy
        if not 0 < p.headroom < 1 or p.sustain_s < 0 or p.dwell_s < 0:
            raise ValueError("P/D headroom must be in (0, 1); sustain and dwell at least 0")

    def slo_for(self, model: str, deployment: str) -> SLO:
        return (self.slos.get(("deployment", deployment)) if deployment else None) \
            or self.slos.get(("model", model)) or self.default_slo


def make_slo(ttft_ms: float, tpot_ms: float) -> SLO:
    if ttft_ms <= 0 or tpot_ms <= 0:
        raise ValueError(f"SLO targets must be positive, got ttft_ms={ttft_ms}, tpot_ms={tpot_ms}")
    return SLO(ttft_s=ttft_ms / 1000.0, tpot_s=tpot_ms / 1000.0)


def parse_slo(text: str, default: SLO) -> tuple[tuple[str, str], SLO]:
    """`deployment=NAME,ttft_ms=500,tpot_ms=40` (or `model=NAME,...`; a missing target takes the
    default's) → (("deployment", NAME), SLO). ValueError for anything else."""
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or name.strip() not in ("deployment", "model", "ttft_ms", "tpot_ms"):
            raise ValueError(f"--pd-slo {text!r}: expected deployment=NAME|model=NAME,ttft_ms=N,tpot_ms=N")
        fields[name.strip()] = value.strip()
    scopes = [k for k in ("deployment", "model") if fields.get(k)]
    if len(scopes) != 1:
        raise ValueError(f"--pd-slo {text!r}: name exactly one deployment=NAME or model=NAME")
    try:
        ttft_ms = float(fields.get("ttft_ms", default.ttft_s * 1000))
        tpot_ms = float(fields.get("tpot_ms", default.tpot_s * 1000))
    except ValueError:
        raise ValueError(f"--pd-slo {text!r}: ttft_ms and tpot_ms must be numbers") from None
    return (scopes[0], fields[scopes[0]]), make_slo(ttft_ms, tpot_ms)
