"""Every metric name (and label) that the Grafana dashboards and the Prometheus alert rules use is
one the services really register: a renamed metric or label fails here, not on a blank panel."""

from __future__ import annotations

import pytest

from . import artifacts as A

FAMILIES = A.registered_metrics()
SAMPLES = A.sample_index(FAMILIES)


def check_query(where: str, expr: str, legend: str = "") -> None:
    q = A.parse_promql(expr)
    assert q.metrics, f"{where}: no metric in {expr!r}"
    labels: set[str] = set(A.TARGET_LABELS)
    for name in q.metrics:
        if name in A.PROMETHEUS_OWN_SERIES:
            continue
        assert name in SAMPLES, (f"{where}: {name!r} is not a series any service exports "
                                 f"(did a metric get renamed? known: {sorted(n for n in SAMPLES if not n.endswith('_created'))})")
        assert not name.endswith("_created"), f"{where}: {name} is a creation timestamp, not a value"
        labels |= SAMPLES[name].labels_of(name)
    for series, label in q.matchers:
        allowed = SAMPLES[series].labels_of(series) if series in SAMPLES else labels | {"__name__"}
        assert label in allowed, f"{where}: {series or 'selector'} has no label {label!r} (has {sorted(allowed)})"
    for label in q.grouping | A.legend_labels(legend):
        assert label in labels, f"{where}: label {label!r} is on none of {sorted(q.metrics)} (labels: {sorted(labels)})"


def test_the_catalogue_sees_every_service():
    services = {f.service for f in FAMILIES.values()}
    assert services == {"coordinator", "controller", "worker", "deployer", "trainer"}
    # the suffix rules: counters are stored with _total, histograms as _bucket/_sum/_count
    assert "mindmotor_coordinator_requests_total" in SAMPLES and "mindmotor_coordinator_requests" not in SAMPLES
    assert "mindmotor_num_preemptions_total" in SAMPLES              # a scrape-time counter family
    assert {"mindmotor_time_to_first_token_seconds_bucket", "mindmotor_npu_hbm_used_bytes",
            "mindmotor_controller_instances"} <= set(SAMPLES)
    assert SAMPLES["mindmotor_npu_power_watts"].labels == {"device"}


@pytest.mark.parametrize("expr", [
    "rate(mindmotor_coordinator_request_total[5m])",                      # renamed counter
    "mindmotor_coordinator_requests",                                    # counter without _total
    "histogram_quantile(0.9, rate(mindmotor_coordinator_time_to_first_token_seconds[5m]))",  # no _bucket
    'sum by (state) (mindmotor_controller_instances{status="ready"})',  # wrong label
    "sum by (models) (mindmotor_coordinator_outstanding_requests)",     # wrong grouping label
    'mindmotor_kv_cache_usage_ratio{model="x"}',                          # a label the worker has not
    "mindmotor_coordinator_routed_total_created",                        # a timestamp, not a value
])
def test_the_checker_catches_mistakes(expr):
    with pytest.raises(AssertionError):
        check_query("example", expr)


def test_the_checker_accepts_what_prometheus_stores():
    check_query("example", 'histogram_quantile(0.99, sum by (le, model) '
                           '(rate(mindmotor_coordinator_e2e_request_latency_seconds_bucket{model=~"$model"}[$__rate_interval])))')
    check_query("example", 'sum by (instance_id) (rate(mindmotor_coordinator_routed_total[5m]))', "{{instance_id}}")
    check_query("example", 'up{job=~"mindmotor-.*"} == 0')


@pytest.mark.parametrize("rule", A.alert_rules(), ids=lambda r: r["alert"])
def test_alert_rule_uses_real_metrics(rule):
    check_query(f"alert {rule['alert']}", rule["expr"])
    assert {"summary"} <= set(rule.get("annotations", {})) and rule.get("labels", {}).get("severity")


@pytest.mark.parametrize("path", A.DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_uses_real_metrics(path):
    dashboard = A.load_dashboard(path)
    queries = list(A.dashboard_queries(dashboard))
    assert len(queries) >= 20
    for where, expr, legend in queries:
        check_query(f"{path.name}: {where}", expr, legend)
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        metric, label = A.label_values_query(query) or (None, None)
        assert metric in SAMPLES, f"{path.name}: variable {var['name']}: {query!r}"
        assert label in SAMPLES[metric].labels_of(metric), f"{path.name}: variable {var['name']}: no label {label!r}"


def test_overview_dashboard_covers_the_platform():
    """The overview shows each area the operations guide promises (by the series it reads)."""
    dashboard = A.load_dashboard(A.GRAFANA / "dashboards" / "mindmotor-overview.json")
    assert dashboard["title"] == "MindMotor overview"
    used = set().union(*(A.parse_promql(e).metrics for _, e, _ in A.dashboard_queries(dashboard)))
    expected = {
        "mindmotor_coordinator_requests_total",                          # request rate by status
        "mindmotor_coordinator_time_to_first_token_seconds_bucket",      # TTFT / TPOT / E2E quantiles
        "mindmotor_coordinator_time_per_output_token_seconds_bucket",
        "mindmotor_coordinator_e2e_request_latency_seconds_bucket",
        "mindmotor_num_requests_running", "mindmotor_num_requests_waiting",
        "mindmotor_kv_cache_usage_ratio", "mindmotor_prefix_cache_hit_rate",
        "mindmotor_coordinator_migrations_total", "mindmotor_coordinator_retries_total",
        "mindmotor_coordinator_pd_prefills_total", "mindmotor_coordinator_pd_fallbacks_total",
        "mindmotor_npu_utilization_percent", "mindmotor_npu_hbm_used_bytes", "mindmotor_npu_power_watts",
        "mindmotor_controller_instances",
    }
    assert expected <= used, sorted(expected - used)
