"""The prefill:decode ratio policy: from measured latency against the deployment's SLO targets to
"switch one instance from role X to role Y", with hysteresis so that roles do not flap.

A pure function (`decide`) of the current roles, one window's measurements, the SLO and the
policy's own memory (`RatioState`):

- pressure = measured p90 / target, for TTFT (prefill side) and TPOT (decode side);
- TTFT over target while TPOT has headroom (pressure below `headroom`) → one decode instance
  should become a prefill instance; the mirror case → one prefill instance should decode;
  both over, or both under, or in between → no change (the band between `headroom` and 1 is the
  hysteresis: a switch is only wished for when the other side can clearly spare an instance);
- a wish must hold for `sustain_s` without interruption, and no switch happens within `dwell_s`
  of the previous one; a role never loses its last instance;
- the instance that switches is the least loaded of its role (it drains fastest).

Every decision carries its reason: a sentence (logged) and a short code (a metric label):
`balanced`, `last_instance`, `sustaining`, `dwell`, `ttft_miss` / `tpot_miss` (a switch).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mindmotor.common.roles import Role
from mindmotor.vocabulary import RatioReason, RatioWish


@dataclass(frozen=True)
class SLO:
    ttft_s: float
    tpot_s: float


@dataclass(frozen=True)
class Measurement:
    ttft_p90_s: float
    tpot_p90_s: float


@dataclass(frozen=True)
class RatioPolicyConfig:
    headroom: float = 0.7            # the other side must be under this fraction of its target
    sustain_s: float = 30.0          # a wish must hold this long
    dwell_s: float = 120.0           # minimum time between two switches


@dataclass
class RatioState:
    wish: RatioWish | None = None
    wish_since: float = 0.0
    last_switch: float = float("-inf")


@dataclass(frozen=True)
class Decision:
    wish: RatioWish | None
    switch: tuple[str, str] | None            # (instance id, new role) to command now, or None
    reason: str
    pressures: dict = field(default_factory=dict)
    code: str = ""                            # the reason as a metric label (see the module doc)


def wish_for(m: Measurement, slo: SLO, headroom: float) -> tuple[RatioWish | None, float, float]:
    ttft, tpot = m.ttft_p90_s / slo.ttft_s, m.tpot_p90_s / slo.tpot_s
    if ttft > 1.0 and tpot < headroom:
        return RatioWish.MORE_PREFILL, ttft, tpot
    if tpot > 1.0 and ttft < headroom:
        return RatioWish.MORE_DECODE, ttft, tpot
    return None, ttft, tpot


def decide(roles: dict[str, str], loads: dict[str, float], m: Measurement, slo: SLO, state: RatioState,
           now: float, config: RatioPolicyConfig = RatioPolicyConfig()) -> Decision:
    """One evaluation; updates `state` (the wish and its start, the time of the last switch)."""
    wish, ttft, tpot = wish_for(m, slo, config.headroom)
    pressures = {"ttft": round(ttft, 3), "tpot": round(tpot, 3)}
    if wish != state.wish:
        state.wish, state.wish_since = wish, now
    if wish is None:
        return Decision(None, None, f"balanced (TTFT at {ttft:.2f}, TPOT at {tpot:.2f} of target)", pressures,
                        RatioReason.BALANCED)
    more_prefill = wish == RatioWish.MORE_PREFILL
    donor_role, new_role = (Role.DECODE, Role.PREFILL) if more_prefill else (Role.PREFILL, Role.DECODE)
    donors = sorted((i for i, r in roles.items() if r == donor_role), key=lambda i: (loads.get(i, 0.0), i))
    if len(donors) < 2:
        return Decision(wish, None, f"{wish}: only {len(donors)} {donor_role} instance(s); keeping them", pressures,
                        RatioReason.LAST_INSTANCE)
    held = now - state.wish_since
    if held < config.sustain_s:
        return Decision(wish, None, f"{wish}: wished for {held:.3g} s of {config.sustain_s:.3g} s", pressures,
                        RatioReason.SUSTAINING)
    if now - state.last_switch < config.dwell_s:
        return Decision(wish, None, f"{wish}: last switch {now - state.last_switch:.3g} s ago "
                                    f"(dwell {config.dwell_s:.3g} s)", pressures, RatioReason.DWELL)
    state.last_switch, state.wish, state.wish_since = now, None, now
    reason = (f"{wish}: TTFT p90 {m.ttft_p90_s:.3f} s vs target {slo.ttft_s:.3f} s, TPOT p90 "
              f"{m.tpot_p90_s:.4f} s vs target {slo.tpot_s:.4f} s for {held:.3g} s; "
              f"{donors[0]} {donor_role} -> {new_role}")
    return Decision(wish, (donors[0], new_role), reason, pressures,
                    RatioReason.TTFT_MISS if more_prefill else RatioReason.TPOT_MISS)
