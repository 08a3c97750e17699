"""benchmarks/pd_goodput.py, on a run smaller than --quick (120 requests at two rates, no bisection:
16 s instead of 64 on a loaded CI host): the issue's keys (steady state and whole run), goodputs
consistent with the runs they come from, curves that do not rise with load, and the TTFT bound
holding for every split. The figures themselves come from the benchmark, not from this test."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import pd_goodput  # noqa: E402

CONFIGS = ("mixed", "mixed_chunked", "1P:3D", "2P:2D", "3P:1D", "dynamic")
NOISE = 0.05          # a few requests of 300 may fare better at a higher rate


def test_a_small_run_reports_goodputs_the_curves_support(capsys):
    pd_goodput.main(["--quick", "--no-plot", "--requests", "120", "--rates", "4,20", "--bisect", "0", "--warmup", "2"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    for key in ("best_split_over_mixed_chunked", "dynamic_over_best_fixed_split",
                "best_split_over_mixed_chunked_whole_run", "dynamic_over_best_fixed_split_whole_run"):
        assert isinstance(out[key], float) and out[key] > 0
    assert set(out["goodput_req_s"]) == set(out["goodput_whole_run_req_s"]) == set(CONFIGS)
    assert set(out["slos"]) == set(pd_goodput.SLOS)
    top = max(out["rates"])
    for slo_name, r in out["slos"].items():
        best = max(("1P:3D", "2P:2D", "3P:1D"), key=lambda c: r["goodput_req_s"][c])
        assert r["best_split_over_mixed_chunked"] == pytest.approx(
            r["goodput_req_s"][best] / r["goodput_req_s"]["mixed_chunked"], abs=0.01)
        for config in CONFIGS:
            goodput, curve = r["goodput_req_s"][config], r["curves"][config]
            assert 0 <= goodput <= top and 0 <= r["goodput_whole_run_req_s"][config] <= top
            rates = [rate for rate, _, _ in curve]
            assert rates == sorted(rates) and set(out["rates"]) <= set(rates)
            # every rate up to the goodput met the SLO; the next one measured above it did not
            assert all(passed for rate, _, passed in curve if rate <= goodput), (slo_name, config, curve)
            above = [passed for rate, _, passed in curve if rate > goodput]
            assert (config in r["at_least"]) == (not above)
            assert not above or not above[0]
            # the share of requests within SLO does not grow with the rate beyond noise
            shares = [share for _, share, _ in curve]
            assert all(b <= a + NOISE for a, b in zip(shares, shares[1:])), (slo_name, config, shares)

    bound = out["ttft_bound"]
    assert 0 < bound["ttft_p90_floor_s"] <= bound["mixed_ttft_p90_s"]
    assert 0 <= bound["ttft_p90_reduction_bound_vs_mixed"] < 1
    assert bound["split_ttft_p90_reduction_vs_mixed"] <= bound["ttft_p90_reduction_bound_vs_mixed"]
    assert out["ttft_p90_reduction_bound_vs_mixed"] == bound["ttft_p90_reduction_bound_vs_mixed"]
