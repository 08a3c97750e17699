"""Routing policies on fake instance views: exact choices."""

from __future__ import annotations

import pytest

from mindmotor.common.block_hash import block_hashes
from mindmotor.coordinator.http.errors import ServiceUnavailable
from mindmotor.coordinator.routing.table import InstanceView, RoutingTable
from mindmotor.coordinator.routing.router import Router
from mindmotor.coordinator.routing.policies import (CacheAware, LeastLoad, RouteRequest, RoundRobin, WeightedRoundRobin,
                                           make_policy)
from mindmotor.coordinator.routing.policies.prefix_index import PrefixIndex
from mindmotor.coordinator.routing.policies.versions import VersionSplit


def view(name: str, **fields) -> InstanceView:
    fields.setdefault("model", "m")
    return InstanceView(instance_id=name, address=f"{name}:1", **fields)


def picks(policy, candidates, count, request=None):
    request = request or RouteRequest([1, 2, 3], 4)
    out = []
    for _ in range(count):
        choice = policy.choose(candidates, request)
        policy.on_routed(choice, request)
        out.append(choice.instance_id)
    return out


def test_round_robin_takes_turns():
    assert picks(RoundRobin(), [view("a"), view("b"), view("c")], 7) == list("abcabca")


def test_smooth_weighted_round_robin_spreads_the_heavy_instance():
    candidates = [view("a", weight=5), view("b", weight=1), view("c", weight=1)]
    assert picks(WeightedRoundRobin(), candidates, 7) == list("aabacaa")
    assert picks(WeightedRoundRobin(), [view("a", weight=2), view("b", weight=1)], 6) == list("abaaba")


def test_weighted_round_robin_skips_zero_weight_unless_all_are_zero():
    assert picks(WeightedRoundRobin(), [view("a", weight=0), view("b", weight=1)], 3) == list("bbb")
    assert picks(WeightedRoundRobin(), [view("a", weight=0), view("b", weight=0)], 2) == list("ab")


def test_least_load_picks_the_fewest_outstanding_tokens():
    candidates = [view("a", outstanding_tokens=300), view("b", outstanding_tokens=100),
                  view("c", outstanding_tokens=200)]
    assert picks(LeastLoad(), candidates, 1) == ["b"]


def test_least_load_breaks_ties_by_reported_queue_then_in_turn():
    candidates = [view("a", running=3), view("b", running=1), view("c", running=1, waiting=0)]
    assert picks(LeastLoad(), candidates, 4) == list("bcbc")


def test_prefix_index_matches_leading_blocks_and_forgets_the_oldest():
    index = PrefixIndex(max_blocks=3)
    index.add("a", [b"1", b"2"])
    assert index.match("a", [b"1", b"2", b"3"]) == 2
    assert index.match("a", [b"9", b"2"]) == 0                  # must be a leading run
    index.add("a", [b"3", b"4"])                                # 4 blocks > 3: b"1" goes
    assert index.match("a", [b"1", b"2"]) == 0 and index.size("a") == 3


def test_cache_aware_sends_a_known_prefix_back_to_its_instance():
    policy = CacheAware(balance_abs_tokens=1000, balance_rel=1.5)
    shared = list(range(40))                                    # 2 full blocks of 16
    a, b = view("a", block_size=16), view("b", block_size=16)
    first = RouteRequest(shared + [100], 8)
    assert policy.choose([a, b], first).instance_id == "a"      # no match anywhere: least_load
    policy.on_routed(a, first)
    other = RouteRequest([900 + i for i in range(40)], 8)
    assert policy.choose([a, b], other).instance_id == "b"      # no match: least_load's turn
    policy.on_routed(b, other)
    again = RouteRequest(shared + [200, 201], 8)
    b_busier = view("b", block_size=16, outstanding_tokens=50)
    assert policy.choose([view("a", block_size=16, outstanding_tokens=500), b_busier], again).instance_id == "a"
    assert policy.index.match("a", again.block_hashes(16)) == 2
    assert again.block_hashes(16) == block_hashes(again.prompt_token_ids, 16)


def test_cache_aware_gives_up_the_match_when_load_is_unbalanced():
    policy = CacheAware(balance_abs_tokens=1000, balance_rel=1.5)
    req = RouteRequest(list(range(32)), 8)
    policy.on_routed(view("a"), req)
    loaded_a = view("a", outstanding_tokens=5000)
    idle_b = view("b", outstanding_tokens=100)
    assert policy.choose([loaded_a, idle_b], req).instance_id == "b"     # 4900 > 1000 and > 1.5 × 100
    near_a = view("a", outstanding_tokens=1000)
    assert policy.choose([near_a, idle_b], req).instance_id == "a"       # 900 ≤ 1000: the match wins


def test_version_split_follows_traffic_weights():
    split = VersionSplit({"v1": 3, "v2": 1})
    candidates = [view("a", version="v1"), view("b", version="v1"), view("c", version="v2")]
    versions = [split.choose(candidates)[0].version for _ in range(8)]
    assert versions == ["v1", "v1", "v2", "v1"] * 2
    assert [c.instance_id for c in split.choose(candidates)] in (["a", "b"], ["c"])


def test_version_split_unweighted_versions_get_nothing_unless_alone():
    split = VersionSplit({"v1": 1})
    candidates = [view("a", version="v1"), view("c", version="v9")]
    assert {split.choose(candidates)[0].version for _ in range(4)} == {"v1"}
    assert split.choose([view("c", version="v9")])[0].version == "v9"


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_router_applies_versions_then_the_policy_and_tracks_load():
    clock = FakeClock()
    table = RoutingTable(suspect_s=5.0, clock=clock)
    for name, version in (("a", "v1"), ("b", "v1"), ("c", "v2")):
        table.upsert(view(name, version=version))
    table.upsert(InstanceView(instance_id="x", address="x:1", model="other"))
    router = Router(table, lambda model: RoundRobin(), traffic={"m": {"v1": 1, "v2": 1}})
    req = RouteRequest([1], 1)
    assert [router.pick("m", req).instance_id for _ in range(4)] == ["a", "c", "b", "c"]
    table.begin("a", 120)
    assert table.candidates("m")[0].outstanding_tokens == 120 and table.candidates("m")[0].in_flight == 1
    table.end("a", 120)
    assert table.candidates("m")[0].outstanding_tokens == 0


def test_router_skips_excluded_failed_and_unhealthy_instances():
    clock = FakeClock()
    table = RoutingTable(suspect_s=5.0, clock=clock)
    reports = []
    table.on_failure(lambda v, reason: reports.append((v.instance_id, reason)))
    table.upsert(view("a"))
    table.upsert(view("b"))
    table.upsert(view("c", healthy=False))
    router = Router(table, lambda model: make_policy("round_robin"))
    req = RouteRequest([1], 1)
    assert router.pick("m", req, exclude={"a"}).instance_id == "b"
    table.mark_failed("b", "UNAVAILABLE")
    assert reports == [("b", "UNAVAILABLE")]
    assert [router.pick("m", req).instance_id for _ in range(2)] == ["a", "a"]
    with pytest.raises(ServiceUnavailable):
        router.pick("m", req, exclude={"a"})
    clock.now += 5.1                                            # the suspicion expires
    assert {router.pick("m", req).instance_id for _ in range(2)} == {"a", "b"}
    with pytest.raises(ServiceUnavailable):
        router.pick("nothing", req)


def test_replace_swaps_the_whole_table():
    table = RoutingTable()
    table.upsert(view("a"))
    table.replace([view("b"), view("c", model="n")])
    assert [v.instance_id for v in table.all()] == ["b", "c"]
    assert sorted(table.models()) == ["m", "n"]
