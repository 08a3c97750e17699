"""Small parts on their own: settings, API keys, the token bucket, sampling options."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mindmotor.coordinator.http.auth import APIKeys
from mindmotor.coordinator.config import CoordinatorSettings, WorkerEntry, load_settings
from mindmotor.coordinator.http.errors import BadRequest, Unauthorized
from mindmotor.coordinator.http.rate_limit import MemoryRateLimiter
from mindmotor.coordinator.openai.sampling import SamplingOptions


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("MINDMOTOR_API_KEYS", "MINDMOTOR_WORKERS", "MINDMOTOR_POLICY", "MINDMOTOR_PORT"):
        monkeypatch.delenv(name, raising=False)


# ---- settings --------------------------------------------------------------------------------
def test_worker_entry_syntax():
    assert WorkerEntry.parse("10.0.0.5:50051") == WorkerEntry(address="10.0.0.5:50051")
    e = WorkerEntry.parse("h:1,weight=2.5,version=v2,deployment=qwen")
    assert (e.weight, e.version, e.deployment) == (2.5, "v2", "qwen")
    with pytest.raises(ValueError):
        WorkerEntry.parse("h:1,colour=red")


def test_flags_beat_env_beat_yaml(tmp_path, monkeypatch, tiny_ckpt):
    config = tmp_path / "coordinator.yaml"
    config.write_text(f"""
port: 9000
policy: round_robin
model_dir: {tiny_ckpt}
workers: [a:1, {{address: "b:2", weight: 3, version: v2}}]
traffic: {{tiny: {{v1: 9, v2: 1}}}}
api_keys: [from-yaml]
max_requests: 7
""")
    s = load_settings(config)
    assert (s.port, s.policy, s.max_requests, s.api_keys) == (9000, "round_robin", 7, ["from-yaml"])
    assert [w.address for w in s.workers] == ["a:1", "b:2"] and s.workers[1].weight == 3
    assert s.traffic == {"tiny": {"v1": 9, "v2": 1}}
    monkeypatch.setenv("MINDMOTOR_API_KEYS", "k1, k2")
    monkeypatch.setenv("MINDMOTOR_POLICY", "cache_aware")
    monkeypatch.setenv("MINDMOTOR_WORKERS", "c:3,d:4")
    s = load_settings(config)
    assert s.api_keys == ["k1", "k2"] and s.policy == "cache_aware" and [w.address for w in s.workers] == ["c:3", "d:4"]
    s = load_settings(config, policy="least_load", port=0)
    assert s.policy == "least_load" and s.port == 0 and s.max_requests == 7


def test_bad_settings_fail_fast(tmp_path):
    with pytest.raises(ValidationError, match="unknown routing policy"):
        CoordinatorSettings(policy="random")
    with pytest.raises(ValidationError, match="not a checkpoint directory"):
        CoordinatorSettings(model_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError):
        load_settings(tmp_path / "missing.yaml")


# ---- auth and rate limit -----------------------------------------------------------------------
def test_api_keys_check():
    keys = APIKeys(["sk-1", "sk-2"])
    assert keys.enabled and not APIKeys([]).enabled
    assert keys.check("Bearer sk-2") == keys.check("bearer  sk-2")
    for header in (None, "", "Bearer ", "sk-1", "Token sk-1", "Bearer sk-3"):
        with pytest.raises(Unauthorized):
            keys.check(header)


def test_memory_token_bucket_exact():
    now = [0.0]
    limiter = MemoryRateLimiter(rpm=60, burst=2, clock=lambda: now[0])      # 1 token per second
    take = limiter._take
    assert [take("k").allowed for _ in range(3)] == [True, True, False]
    assert take("k").retry_after_s == pytest.approx(1.0)
    assert take("other").allowed
    now[0] = 0.5
    assert not take("k").allowed and take("k").retry_after_s == pytest.approx(0.5)
    now[0] = 1.0
    assert take("k").allowed and not take("k").allowed
    now[0] = 100.0
    assert [take("k").allowed for _ in range(3)] == [True, True, False]   # capped at the burst


# ---- sampling ----------------------------------------------------------------------------------
def test_sampling_options_validate_and_convert():
    with pytest.raises(BadRequest, match="temperature"):
        SamplingOptions(temperature=2.5)
    opts = SamplingOptions(max_tokens=20, min_tokens=5, seed=10, temperature=0.0, logprobs=2, stop=("x",))
    p = opts.to_proto()           # the same for a resumed attempt: its worker counts the whole output
    assert (p.max_tokens, p.min_tokens, p.seed, p.temperature, p.logprobs, list(p.stop)) == (20, 5, 10, 0.0, 2, ["x"])
    assert not SamplingOptions(max_tokens=None).to_proto().HasField("max_tokens")
    assert [opts.for_choice(i).seed for i in range(3)] == [10, 11, 12]
    assert SamplingOptions(seed=None).for_choice(2).seed is None


def test_http_listening_socket_is_tcp_so_asyncio_disables_nagle():
    """asyncio sets TCP_NODELAY on accepted connections only when the listening socket's protocol
    is IPPROTO_TCP; with protocol 0 every response waited ~40 ms for a delayed ACK."""
    import socket

    from mindmotor.coordinator.http.server import bind_socket

    sock = bind_socket("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()
