"""The prefill:decode ratio policy: a sustained, one-sided SLO miss switches the least loaded
instance of the other side; hysteresis (headroom band, sustain time, dwell time) stops flapping;
a role never loses its last instance."""

from __future__ import annotations

from mindmotor.vocabulary import RatioWish
from mindmotor.controller.pd_ratio import Measurement, RatioPolicyConfig, RatioState, SLO, decide

MORE_PREFILL, MORE_DECODE = RatioWish.MORE_PREFILL, RatioWish.MORE_DECODE

SLO_ = SLO(ttft_s=0.5, tpot_s=0.05)
CFG = RatioPolicyConfig(headroom=0.7, sustain_s=30, dwell_s=120)
ROLES = {"p0": "prefill", "p1": "prefill", "d0": "decode", "d1": "decode"}
LOADS = {"d0": 9.0, "d1": 2.0, "p0": 1.0, "p1": 5.0}
SLOW_PREFILL = Measurement(ttft_p90_s=0.9, tpot_p90_s=0.02)     # TTFT 1.8x target, TPOT 0.4x
SLOW_DECODE = Measurement(ttft_p90_s=0.2, tpot_p90_s=0.08)


def test_sustained_ttft_miss_turns_the_least_loaded_decode_into_prefill():
    state = RatioState()
    first = decide(ROLES, LOADS, SLOW_PREFILL, SLO_, state, now=0.0, config=CFG)
    assert first.wish == MORE_PREFILL and first.switch is None and "wished for 0 s" in first.reason
    assert decide(ROLES, LOADS, SLOW_PREFILL, SLO_, state, now=29.0, config=CFG).switch is None
    go = decide(ROLES, LOADS, SLOW_PREFILL, SLO_, state, now=30.0, config=CFG)
    assert go.switch == ("d1", "prefill") and "TTFT p90 0.900" in go.reason


def test_tpot_miss_turns_a_prefill_into_decode():
    state = RatioState()
    decide(ROLES, LOADS, SLOW_DECODE, SLO_, state, now=0.0, config=CFG)
    go = decide(ROLES, LOADS, SLOW_DECODE, SLO_, state, now=31.0, config=CFG)
    assert go.wish == MORE_DECODE and go.switch == ("p0", "decode")


def test_interrupted_wish_restarts_and_dwell_blocks_flapping():
    state = RatioState()
    decide(ROLES, LOADS, SLOW_PREFILL, SLO_, state, now=0.0, config=CFG)
    balanced = decide(ROLES, LOADS, Measurement(0.4, 0.04), SLO_, state, now=20.0, config=CFG)
    assert balanced.wish is None and balanced.switch is None
    decide(ROLES, LOADS, SLOW_PREFILL, SLO_, state, now=25.0, config=CFG)
    assert decide(ROLES, LOADS, SLOW_PREFILL, SLO_, state, now=50.0, config=CFG).switch is None
    assert decide(ROLES, LOADS, SLOW_PREFILL, SLO_, state, now=55.0, config=CFG).switch is not None
    # the other way right after: held back by the dwell time, whatever the sustain
    decide(ROLES, LOADS, SLOW_DECODE, SLO_, state, now=60.0, config=CFG)
    blocked = decide(ROLES, LOADS, SLOW_DECODE, SLO_, state, now=100.0, config=CFG)
    assert blocked.switch is None and "dwell" in blocked.reason
    assert decide(ROLES, LOADS, SLOW_DECODE, SLO_, state, now=175.0, config=CFG).switch == ("p0", "decode")


def test_no_switch_inside_the_hysteresis_band_or_from_a_last_instance():
    state = RatioState()
    both_bad = Measurement(ttft_p90_s=0.9, tpot_p90_s=0.045)        # TPOT at 0.9: no headroom to give
    for t in (0.0, 100.0, 300.0):
        assert decide(ROLES, LOADS, both_bad, SLO_, state, now=t, config=CFG).switch is None
    lone = {"p0": "prefill", "d0": "decode"}
    for t in (0.0, 100.0, 300.0):
        d = decide(lone, LOADS, SLOW_PREFILL, SLO_, state, now=t, config=CFG)
        assert d.switch is None and "only 1 decode" in d.reason
