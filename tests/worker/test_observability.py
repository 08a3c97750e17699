"""Status, the gRPC health service, Prometheus /metrics, and `fetch_status` for npu-smi."""

from __future__ import annotations

import urllib.request

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from mindmotor.common.roles import Role
from mindmotor.npu_smi_cli import snapshots_from_metrics
from mindmotor.device.npu_smi import format_npu_smi
from mindmotor.protocol import worker_pb2 as pb
from mindmotor.worker.client import fetch_status

from .rpc import collect, request

GiB = 2**30


@pytest.fixture(scope="module")
def served(worker):
    """The shared worker after a few finished requests (one of them with a cached prefix)."""
    shared = "A shared prefix of some length, long enough to fill a couple of KV blocks. " * 2
    for i in range(3):
        collect(worker.stub.Generate(request(shared + str(i), max_tokens=6, ignore_eos=True), timeout=30))
    return worker


def scrape(worker) -> dict[str, list]:
    with urllib.request.urlopen(worker.metrics_url, timeout=5) as response:
        text = response.read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}, text


def value(samples, name: str, **labels) -> float:
    (match,) = [s.value for s in samples if s.name == name and all(s.labels.get(k) == v
                                                                     for k, v in labels.items())]
    return match


def test_status_fields(served, tiny_model):
    status = served.stub.Status(pb.StatusRequest(), timeout=5)

    assert status.model == tiny_model.name
    assert status.max_model_len == 1024 and status.block_size == 16
    assert status.role == Role.MIXED.to_proto() and status.state == "serving" and status.timing == "virtual"
    assert status.worker_id
    load = status.load
    assert load.running == 0 and load.waiting == 0 and load.in_flight == 0
    assert load.num_blocks > 0 and load.num_free_blocks == load.num_blocks and load.kv_usage == 0.0
    assert load.prompt_tokens > 0 and load.generation_tokens >= 18 and load.steps > 0
    assert 0.0 < load.prefix_hit_rate <= 1.0
    assert load.emulated_time_s > 0
    device = status.device
    assert device.device == "910B3" and device.health == "OK" and device.aicore_freq_mhz == 1800
    assert device.hbm_total_bytes == 64 * GiB
    assert 0 < device.hbm_used_bytes <= device.hbm_total_bytes
    assert 0.0 <= device.utilization <= 100.0
    assert device.power_w > 0 and 20.0 < device.temperature_c < 110.0


def test_health_service_is_serving(worker):
    stub = health_pb2_grpc.HealthStub(worker.channel)
    for service in ("", "mindmotor.v1.Worker"):
        response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_metrics_after_requests(served):
    families, _ = scrape(served)
    samples = [s for family in families.values() for s in family]

    assert value(samples, "mindmotor_num_requests_running") == 0
    assert value(samples, "mindmotor_num_requests_waiting") == 0
    assert value(samples, "mindmotor_kv_cache_usage_ratio") == 0
    assert 0 < value(samples, "mindmotor_prefix_cache_hit_rate") <= 1
    assert value(samples, "mindmotor_num_preemptions_total") >= 0
    assert value(samples, "mindmotor_prompt_tokens_total") > 0
    assert value(samples, "mindmotor_generation_tokens_total") >= 18
    assert value(samples, "mindmotor_host_lag_seconds_total") >= 0
    assert value(samples, "mindmotor_time_to_first_token_seconds_count") >= 3
    assert value(samples, "mindmotor_time_per_output_token_seconds_count") >= 15
    assert value(samples, "mindmotor_requests_total", finish_reason="length") >= 3
    assert value(samples, "mindmotor_npu_hbm_total_bytes", device="910B3") == 64 * GiB
    assert 0 < value(samples, "mindmotor_npu_hbm_used_bytes", device="910B3") <= 64 * GiB
    assert 0 <= value(samples, "mindmotor_npu_utilization_percent", device="910B3") <= 100
    assert value(samples, "mindmotor_npu_power_watts", device="910B3") > 0
    assert 20 < value(samples, "mindmotor_npu_temperature_celsius", device="910B3") < 110


def test_npu_smi_reads_the_metrics_port(served):
    _, text = scrape(served)
    (snapshot,) = snapshots_from_metrics(text)
    assert snapshot["device"] == "910B3" and snapshot["hbm_total_bytes"] == 64 * GiB


def test_fetch_status_gives_an_npu_smi_snapshot(served):
    snapshot = fetch_status(served.address, timeout=5)

    assert snapshot["device"] == "910B3" and snapshot["health"] == "OK"
    assert snapshot["hbm_total_bytes"] == 64 * GiB and snapshot["aicore_freq_mhz"] == 1800
    assert snapshot["load"]["running"] == 0 and snapshot["load"]["num_blocks"] > 0
    assert snapshot["state"] == "serving" and snapshot["role"] == "mixed"
    table = format_npu_smi([snapshot])
    assert "910B3" in table and "65536" in table


def test_fetch_status_of_nothing_is_an_os_error():
    with pytest.raises(OSError, match="cannot read the status"):
        fetch_status("127.0.0.1:1", timeout=1)


def test_npu_smi_command_asks_a_live_worker(served):
    """`mindmotor npu-smi --worker HOST:PORT`, as a user runs it, in its own process."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "mindmotor.cli", "npu-smi", "--worker", served.address],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "910B3" in result.stdout and "65536" in result.stdout and "OK" in result.stdout


def test_vllm_metric_names(served, tiny_model):
    """vLLM's names, buckets and model_name label beside ours, with the same values."""
    families, text = scrape(served)
    m = {"model_name": tiny_model.name}
    assert value(families["vllm:num_requests_running"], "vllm:num_requests_running", **m) == 0
    assert value(families["vllm:kv_cache_usage_perc"], "vllm:kv_cache_usage_perc", **m) == 0
    hits = value(families["vllm:prefix_cache_hits"], "vllm:prefix_cache_hits_total", **m)
    queries = value(families["vllm:prefix_cache_queries"], "vllm:prefix_cache_queries_total", **m)
    assert 0 < hits < queries
    assert value(families["vllm:generation_tokens"], "vllm:generation_tokens_total", **m) >= 18
    assert value(families["vllm:time_to_first_token_seconds"], "vllm:time_to_first_token_seconds_count", **m) >= 3
    assert f'vllm:time_to_first_token_seconds_bucket{{le="2560.0",model_name="{tiny_model.name}"}}' in text
    assert f'vllm:e2e_request_latency_seconds_bucket{{le="7680.0",model_name="{tiny_model.name}"}}' in text
    assert value(families["vllm:request_success"], "vllm:request_success_total", finished_reason="length", **m) >= 3


def test_kv_host_tier_metrics(served, tiny_model):
    """The worker keeps a KV host tier by default: its budget, usage and load histogram are exported,
    with vLLM's external prefix-cache counters."""
    families, text = scrape(served)
    assert value(families["mindmotor_kv_tier_budget_bytes"], "mindmotor_kv_tier_budget_bytes") > 0
    assert value(families["mindmotor_kv_tier_bytes"], "mindmotor_kv_tier_bytes") >= 0
    assert "mindmotor_kv_tier_load_seconds_bucket{le=\"+Inf\"}" in text
    m = {"model_name": tiny_model.name}
    assert value(families["vllm:external_prefix_cache_queries"], "vllm:external_prefix_cache_queries_total", **m) >= 0
