"""Canary analysis, in-process: the verdict on figures (error margin, p90 TTFT margin, min
requests), the coordinators' counters differenced over a window (restarts, several coordinators),
and the Apply-time tokenizer check."""

from __future__ import annotations

import math

import pytest

from mindmotor.common.store import MemoryStore
from mindmotor.deployer.analysis import AnalysisSettings, Figures, judge
from mindmotor.deployer.coordinator_metrics import CoordinatorFigures, parse_totals
from mindmotor.deployer.operations import Deployments, FailedPrecondition
from mindmotor.deployer.spec import parse_spec
from mindmotor.deployer.store import DeploymentStore

INF = math.inf


def figures(requests, errors=0, fast=None, slow=0):
    """`fast` TTFTs under 0.1 s, `slow` between 1 and 2 s."""
    fast = requests - slow if fast is None else fast
    return Figures(requests, errors, ((0.1, fast), (1.0, fast), (2.0, fast + slow), (INF, fast + slow)))


def test_the_verdict_follows_the_margins_and_waits_for_enough_requests():
    settings = AnalysisSettings(max_error_rate_increase=0.05, max_ttft_p90_increase=0.5, min_requests=10)
    stable = figures(100, errors=2)
    waiting = judge(settings, "v2", figures(9, errors=9), "v1", stable, 30)
    assert not waiting.failed and waiting.summary.startswith("waiting for 10 requests to v2")
    assert not judge(settings, "v2", figures(20, errors=1), "v1", stable, 30).failed       # 5% <= 2% + 5
    errors = judge(settings, "v2", figures(20, errors=2), "v1", stable, 30)                # 10% > 7%
    assert errors.failed and errors.summary.startswith(
        "error rate of v2 10.0% exceeds v1's 2.0% by more than the margin of 5.0 points (over the last 30 s: "
        "v2 20 requests, 2 errors (10.0%)")
    slow = judge(settings, "v2", figures(20, slow=10), "v1", stable, 30)
    assert slow.failed and slow.summary.startswith("p90 TTFT of v2 1.8 s exceeds v1's 0.0") and "margin of 50%" in slow.summary
    assert not judge(AnalysisSettings(max_ttft_p90_increase=-1, min_requests=10), "v2", figures(20, slow=10), "v1",
                     stable, 30).failed                                                   # TTFT not judged
    assert not judge(settings, "v2", figures(20, slow=10), "v1", figures(5), 30).failed   # too little to compare


def test_quantiles_interpolate_within_a_bucket():
    f = Figures(10, 0, ((0.1, 0), (0.2, 10), (INF, 10)))
    assert f.ttft_quantile(0.9) == pytest.approx(0.19)
    assert Figures(4, 0, ((0.1, 0), (INF, 4))).ttft_quantile(0.9) == 0.1                   # in +Inf: the last bound
    assert Figures().ttft_quantile(0.9) is None


def exposition(requests, errors, buckets, version="v2"):
    lines = [f'mindmotor_coordinator_version_requests_total{{model="m",version="{version}"}} {requests}',
             f'mindmotor_coordinator_version_errors_total{{model="m",version="{version}"}} {errors}']
    lines += [f'mindmotor_coordinator_version_time_to_first_token_seconds_bucket{{le="{le}",model="m",'
              f'version="{version}"}} {n}' for le, n in buckets]
    return "\n".join(lines) + "\n"


class Clock:
    now = 1000.0

    def __call__(self):
        return self.now


def test_figures_are_differenced_over_the_window_and_survive_a_coordinator_restart():
    clock = Clock()
    source = CoordinatorFigures(["http://a", "http://b"], clock=clock)

    def sample(url, text):
        source._samples[url].append((clock.now, parse_totals(text)))

    sample("http://a", exposition(100, 1, [("0.1", 100), ("+Inf", 100)]))     # before the canary began
    clock.now = 1010
    sample("http://a", exposition(110, 1, [("0.1", 110), ("+Inf", 110)]))
    sample("http://b", exposition(50, 0, [("0.1", 50), ("+Inf", 50)]))
    clock.now = 1020
    sample("http://a", exposition(5, 5, [("0.1", 0), ("+Inf", 5)]))           # restarted: counts from 0
    sample("http://b", exposition(60, 2, [("0.1", 60), ("+Inf", 60)]))
    found, covered = source.window("m", ["v2", "v1"], since=1005, window_s=60)
    assert covered == 10
    assert (found["v2"].requests, found["v2"].errors) == (15, 7)               # a: 5 (restart), b: 10
    assert dict(found["v2"].ttft_buckets) == {0.1: 10, INF: 15}
    assert found["v1"].requests == 0


@pytest.mark.asyncio
async def test_apply_refuses_a_new_version_with_another_tokenizer(tiny_ckpt):
    ops = Deployments(DeploymentStore(MemoryStore()))

    def spec(*versions):
        return parse_spec({"name": "demo", "model": "m", "versions": list(versions)})

    await ops.apply(spec({"name": "v1", "checkpoint": str(tiny_ckpt)}))
    with pytest.raises(FailedPrecondition, match=r"v2's checkpoint has another tokenizer than v1.*digest of v1: [0-9a-f]{64}, "
                                                 r"of v2: [0-9a-f]{64}"):
        await ops.apply(spec({"name": "v1", "checkpoint": str(tiny_ckpt)}, {"name": "v2", "checkpoint": ""}))
    assert (await ops.get("demo")).spec.version_names() == ["v1"]
    allowed = await ops.apply(spec({"name": "v1", "checkpoint": str(tiny_ckpt)}, {"name": "v2", "checkpoint": ""}),
                              allow_tokenizer_change=True)
    assert allowed.spec.version_names() == ["v1", "v2"]
    with pytest.raises(FailedPrecondition, match="another tokenizer"):              # a new deployment's versions
        await ops.apply(parse_spec({"name": "other", "model": "o", "versions": [
            {"name": "a", "checkpoint": str(tiny_ckpt)}, {"name": "b", "checkpoint": ""}]}))
