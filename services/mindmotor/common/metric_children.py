"""`cache_children(metric)`: a Prometheus metric's `labels(...)` answered from a dict of the
children it already made. prometheus_client's own takes a lock and converts and checks every value
on each call, and a request makes some thirty of those calls in the coordinator, ten in the worker
(issue 26). Only for metrics whose children are never removed or cleared."""

from __future__ import annotations

MAX_CACHED_CHILDREN = 10_000      # per metric: a label set past it clears the cache (the series stay)


def cache_children(metric) -> None:
    if not getattr(metric, "_labelnames", None):
        return
    children: dict = {}
    make = metric.labels

    def labels(*values, **named):
        key = (values, tuple(named.items())) if named else values
        child = children.get(key)
        if child is None:
            if len(children) >= MAX_CACHED_CHILDREN:
                children.clear()
            child = children[key] = make(*values, **named)
        return child

    metric.labels = labels


def cache_all(*metrics) -> None:
    for metric in metrics:
        cache_children(metric)
