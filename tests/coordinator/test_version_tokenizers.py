"""Versions of one model with different tokenizers, in-process (catalog, routing table, router):
the version is picked first by the traffic weights, the request gets that version's tokenizer and
may be routed only to versions sharing it; versions that tokenize alike change nothing."""

from __future__ import annotations

from collections import Counter

from mindmotor.common.tokenizer import TokenizerFiles
from mindmotor.coordinator.config import CoordinatorSettings
from mindmotor.coordinator.routing.table import InstanceView, RoutingTable
from mindmotor.coordinator.catalog.models import ModelCatalog, ModelTokenizer
from mindmotor.coordinator.routing.router import NoInstanceAvailable, Router
from mindmotor.coordinator.routing.policies import RoundRobin, RouteRequest
from mindmotor.model.checkpoint import resolve_model_dir

import pytest


def setup(tiny_ckpt, weights):
    table = RoutingTable()
    for version in ("v1", "v2", "v3"):
        table.upsert(InstanceView(f"d-{version}-0", f"127.0.0.1:{version[-1]}", model="m", deployment="d",
                                  version=version))
    catalog = ModelCatalog(CoordinatorSettings(models={"m": str(tiny_ckpt)}), table)
    router = Router(table, lambda model: RoundRobin(), traffic={"m": weights})
    bundled = ModelTokenizer.build(TokenizerFiles.read(resolve_model_dir(None)), "bundled")
    return table, catalog, router, bundled


def test_alike_versions_are_not_restricted(tiny_ckpt):
    _, catalog, router, _ = setup(tiny_ckpt, {"v1": 1, "v2": 1, "v3": 1})
    digest = catalog.digest("m")
    for version in ("v1", "v2", "v3"):
        catalog.note_version("m", version, digest)
    served = catalog.resolve("m", router.choose_version)
    assert served.versions is None and served.tokenizer is catalog.tokenizer("m")


def test_the_version_is_picked_first_and_its_tokenizer_used(tiny_ckpt):
    _, catalog, router, bundled = setup(tiny_ckpt, {"v1": 2, "v2": 1, "v3": 1})
    catalog.note_version("m", "v2", bundled.digest)                    # v2: its own tokenizer, not fetched yet
    only_known = {catalog.resolve("m", router.choose_version).versions for _ in range(8)}
    assert only_known == {frozenset({"v1", "v3"})}                     # v2 gets nothing until its tokenizer is known

    catalog.add_tokenizer(bundled)
    picked = Counter()
    for _ in range(40):
        served = catalog.resolve("m", router.choose_version)
        if served.versions == frozenset({"v2"}):
            assert served.tokenizer is bundled.tokenizer
            instance = router.pick("m", RouteRequest([1, 2], 2), versions=served.versions)
            assert instance.version == "v2"
            picked["v2"] += 1
        else:
            assert served.versions == frozenset({"v1", "v3"}) and served.tokenizer is catalog.tokenizer("m")
            assert router.pick("m", RouteRequest([1, 2], 2), versions=served.versions).version in ("v1", "v3")
            picked["v1+v3"] += 1
    assert picked == {"v2": 10, "v1+v3": 30}                           # the weights: 2 + 1 against 1
    with pytest.raises(NoInstanceAvailable):                           # retries stay on its versions
        router.pick("m", RouteRequest([1], 1), exclude={"d-v2-0"}, versions=frozenset({"v2"}))


def test_once_only_versions_with_another_tokenizer_are_left_their_tokenizer_is_used(tiny_ckpt):
    table, catalog, router, bundled = setup(tiny_ckpt, {"v2": 1})
    catalog.note_version("m", "v2", bundled.digest)
    catalog.add_tokenizer(bundled)
    for gone in ("d-v1-0", "d-v3-0"):                                  # the canary v2 was promoted
        table.remove(gone)
    served = catalog.resolve("m", router.choose_version)
    assert served.tokenizer is bundled.tokenizer and served.versions is None
    assert catalog.resolve("m").tokenizer is catalog.tokenizer("m")     # /tokenize: the model's own
