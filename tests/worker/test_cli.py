"""`mindmotor worker` flags and start-up failures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mindmotor.cli import build_parser
from mindmotor.worker.cli import config_from_args

FLAGS = ["--model", "--port", "--device", "--emulate", "--timing", "--host", "--metrics-port",
         "--max-num-seqs", "--max-num-batched-tokens", "--num-blocks", "--block-size",
         "--no-prefix-caching", "--no-chunked-prefill", "--memory-fraction", "--tp", "--drain-timeout",
         "--worker-id", "--kv-host-budget", "--stream-keepalive", "--engine-stall-timeout",
         "--long-prefill-token-threshold", "--max-num-partial-prefills", "--max-num-batched-attention",
         "--spec-helpers", "--spec-timeout", "--resume-retention", "--kv-host-bytes", "--cache-chunk-size",
         "--prefetch-depth", "--kv-shared", "--kv-shared-ttl", "--redis-url-file", "--priority-aging-s",
         "--lower-class-prefill-tokens", "--preferred-batch-size", "--batch-timeout-s", "--inject-delay"]


def test_flags_build_the_configs():
    args = build_parser().parse_args([
        "worker", "--model", "/m", "--port", "0", "--device", "910B4", "--emulate", "qwen2-7b",
        "--timing", "virtual", "--host", "127.0.0.1", "--metrics-port", "9100", "--max-num-seqs", "8",
        "--max-num-batched-tokens", "512", "--num-blocks", "64", "--block-size", "32",
        "--no-prefix-caching", "--no-chunked-prefill", "--memory-fraction", "0.5", "--tp", "2",
        "--drain-timeout", "3", "--worker-id", "w-1", "--stream-keepalive", "0.25", "--engine-stall-timeout", "4"])
    config = config_from_args(args)
    e = config.engine
    assert (config.host, config.port, config.metrics_port, config.worker_id, config.drain_timeout_s) == (
        "127.0.0.1", 0, 9100, "w-1", 3.0)
    assert (config.stream_keepalive_s, config.engine_stall_timeout_s) == (0.25, 4.0)
    assert (e.model, e.device, e.emulate, e.timing, e.tensor_parallel) == ("/m", "910B4", "qwen2-7b", "virtual", 2)
    assert (e.max_num_seqs, e.max_num_batched_tokens, e.num_blocks, e.block_size) == (8, 512, 64, 32)
    assert not e.enable_prefix_caching and not e.enable_chunked_prefill and e.memory_fraction == 0.5


def test_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--help"])
    text = capsys.readouterr().out
    assert [flag for flag in FLAGS if flag not in text] == []


def test_a_missing_model_fails_with_exit_1_and_a_json_error(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mindmotor.cli", "worker", "--model", str(tmp_path / "nope"),
                           "--port", "0", "--timing", "virtual"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "MINDMOTOR_WORKER_READY" not in done.stdout
    (entry,) = [json.loads(line) for line in done.stderr.splitlines() if '"worker failed"' in line]
    assert "does not exist" in entry["error"]


def test_the_kv_host_budget_flag_takes_sizes_and_refuses_nonsense(capsys):
    args = build_parser().parse_args(["worker", "--kv-host-budget", "512MiB"])
    assert config_from_args(args).engine.kv_host_budget_bytes == 512 * 2**20
    assert config_from_args(build_parser().parse_args(["worker"])).engine.kv_host_budget_bytes is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--kv-host-budget", "lots"])
    assert "not a size: 'lots'" in capsys.readouterr().err


def test_under_mutual_tls_a_worker_registers_under_its_certificates_name(tmp_path):
    from mindmotor.common import certs
    from mindmotor.worker.cli import worker_id_for

    certs.init_ca(tmp_path)
    worker = certs.issue(tmp_path, "w-a", "worker").cert.read_bytes()
    assert worker_id_for(None, worker) == "w-a"                     # --worker-id may be left out
    assert worker_id_for("w-a", worker) == "w-a"
    with pytest.raises(ValueError, match="is not this worker's certificate name"):
        worker_id_for("w-b", worker)                                # the controller would refuse it
    assert worker_id_for("w-b", None) == "w-b"                      # token or open mode: as given
    assert worker_id_for("w-b", certs.issue(tmp_path, "ops", "admin").cert.read_bytes()) == "w-b"


def test_fair_prefill_flags_default_to_a_bounded_step_and_refuse_nonsense(capsys):
    default = config_from_args(build_parser().parse_args(["worker"])).engine
    assert (default.long_prefill_token_threshold, default.max_num_partial_prefills) == (0, 1)
    assert default.max_num_batched_attention is None                    # auto: from the served model
    args = build_parser().parse_args(["worker", "--long-prefill-token-threshold", "256", "--max-num-partial-prefills",
                                      "2", "--max-num-batched-attention", "65536"])
    e = config_from_args(args).engine
    assert (e.long_prefill_token_threshold, e.max_num_partial_prefills, e.max_num_batched_attention) == (256, 2, 65536)
    off = build_parser().parse_args(["worker", "--max-num-batched-attention", "0"])
    assert config_from_args(off).engine.max_num_batched_attention == 0
    for bad in ("lots", "-1"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["worker", "--max-num-batched-attention", bad])
    assert "expected a number of query-key pairs or 'auto'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="max_num_partial_prefills"):
        config_from_args(build_parser().parse_args(["worker", "--max-num-partial-prefills", "0"]))


def test_slo_class_and_batch_timeout_flags_reach_the_engine_and_refuse_nonsense():
    default = config_from_args(build_parser().parse_args(["worker"])).engine
    assert (default.priority_aging_s, default.lower_class_prefill_tokens) == (10.0, 256)
    assert (default.batch_timeout_s, default.preferred_batch_size) == (0.0, 0)          # no waiting for a batch
    args = build_parser().parse_args(["worker", "--priority-aging-s", "2.5", "--lower-class-prefill-tokens", "0",
                                      "--preferred-batch-size", "8", "--batch-timeout-s", "0.002"])
    e = config_from_args(args).engine
    assert (e.priority_aging_s, e.lower_class_prefill_tokens, e.preferred_batch_size, e.batch_timeout_s) == \
        (2.5, 0, 8, 0.002)
    with pytest.raises(ValueError, match="priority_aging_s"):
        config_from_args(build_parser().parse_args(["worker", "--priority-aging-s", "-1"]))


def test_the_kv_host_tier_flags_take_sizes_and_refuse_nonsense(capsys):
    default = config_from_args(build_parser().parse_args(["worker"])).engine
    assert default.kv_host_bytes is None and default.prefetch_depth == 2      # None: 5% of the machine
    args = build_parser().parse_args(["worker", "--kv-host-bytes", "1GiB", "--cache-chunk-size", "64MiB",
                                      "--prefetch-depth", "3"])
    e = config_from_args(args).engine
    assert (e.kv_host_bytes, e.cache_chunk_size, e.prefetch_depth) == (2**30, 64 * 2**20, 3)
    assert config_from_args(build_parser().parse_args(["worker", "--kv-host-bytes", "0"])).engine.kv_host_bytes == 0
    for flag, bad in (("--kv-host-bytes", "lots"), ("--prefetch-depth", "0"), ("--cache-chunk-size", "-1")):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["worker", flag, bad])


def test_the_shared_kv_tier_needs_a_redis_and_the_host_tier(tmp_path, monkeypatch):
    monkeypatch.delenv("MINDMOTOR_REDIS_URL", raising=False)
    with pytest.raises(ValueError, match="needs a Redis"):
        config_from_args(build_parser().parse_args(["worker", "--kv-shared"]))
    url = tmp_path / "redis-url"
    url.write_text("redis://127.0.0.1:6379/0\n")
    with pytest.raises(ValueError, match="--kv-host-bytes above 0"):
        config_from_args(build_parser().parse_args(["worker", "--kv-shared", "--redis-url-file", str(url),
                                                    "--kv-host-bytes", "0"]))
    config = config_from_args(build_parser().parse_args(["worker", "--kv-shared", "--redis-url-file", str(url)]))
    assert config.kv_shared and config.redis_url == "redis://127.0.0.1:6379/0" and config.kv_shared_ttl_s == 600


def test_the_test_only_delay_names_a_phase_and_seconds():
    from mindmotor.worker.config import parse_injected_delay

    config = config_from_args(build_parser().parse_args(["worker", "--inject-delay", "network=0.25"]))
    assert parse_injected_delay(config.inject_delay) == ("network", 0.25)
    assert config_from_args(build_parser().parse_args(["worker"])).inject_delay is None
    for bad in ("prefill=1", "worker_queue", "worker_queue=-1", "worker_queue=x", "network=61"):
        with pytest.raises(ValueError, match="PHASE=SECONDS"):
            parse_injected_delay(bad)
