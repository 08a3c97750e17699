"""LoRA adapters on a real worker process: served from --lora-modules and loaded/unloaded at run
time while requests run; a request names its adapter; a bad adapter is refused with its reason
and changes nothing; the adapters show in the metrics."""

from __future__ import annotations

import urllib.request

import grpc
import numpy as np
import pytest

from mindmotor.model.llama import LlamaModel
from mindmotor.model.lora import load_adapter
from mindmotor.model.testing import write_random_adapter
from mindmotor.protocol import worker_pb2 as pb

from .rpc import collect, request

PROMPT = [5, 17, 99, 3, 250, 41, 8]


def reference(model, adapter, n: int = 6) -> list[int]:
    ids = list(PROMPT)
    for _ in range(n):
        ids.append(int(np.argmax(model.forward_dense(ids, adapter)[-1])))
    return ids[len(PROMPT):]


def generate(worker, lora: str = "", n: int = 6):
    req = request(PROMPT, max_tokens=n, ignore_eos=True)
    req.lora_name = lora
    return collect(worker.stub.Generate(req, timeout=30))


@pytest.fixture(scope="module")
def adapters(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    config = LlamaModel.from_pretrained(tiny_model).config
    good = {name: write_random_adapter(root / name, config, seed=i) for i, name in enumerate(("a", "b"))}
    broken = root / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text((good["a"] / "adapter_config.json").read_text())
    (broken / "adapter_model.safetensors").write_bytes((good["a"] / "adapter_model.safetensors").read_bytes()[:-64])
    big = write_random_adapter(root / "big", config, rank=64, seed=9)
    return good, broken, big


def test_adapters_serve_load_and_unload_at_run_time(start_worker, tiny_model, adapters):
    (good, broken, big) = adapters
    worker = start_worker("--timing", "virtual", "--enable-lora", "--lora-modules", f"a={good['a']}",
                          "--max-loras", "2", "--max-lora-rank", "16")
    model = LlamaModel.from_pretrained(tiny_model)
    listed = worker.stub.ListLoraAdapters(pb.ListLoraAdaptersRequest(), timeout=5)
    assert listed.enabled and [a.name for a in listed.adapters] == ["a"] and listed.max_loras == 2

    assert generate(worker, "a").token_ids == reference(model, load_adapter(good["a"], model.config, 16))
    assert generate(worker).token_ids == reference(model, None)

    with pytest.raises(grpc.RpcError) as info:                       # unknown: refused, named
        generate(worker, "b")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'b' does not exist" in info.value.details()

    for path, reason in ((broken, "past the end"), (big, "above --max-lora-rank 16")):
        with pytest.raises(grpc.RpcError) as info:
            worker.stub.LoadLoraAdapter(pb.LoadLoraAdapterRequest(lora_name="b", lora_path=str(path)), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and reason in info.value.details()
    assert [a.name for a in worker.stub.ListLoraAdapters(pb.ListLoraAdaptersRequest(), timeout=5).adapters] == ["a"]

    # load b while a long request of a runs; unload a: the running request finishes, new ones are refused
    long = worker.stub.Generate(request(PROMPT, max_tokens=200, ignore_eos=True, **{}), timeout=60)
    running = request(PROMPT, max_tokens=40, ignore_eos=True)
    running.lora_name = "a"
    running_stream = worker.stub.Generate(running, timeout=60)
    loaded = worker.stub.LoadLoraAdapter(pb.LoadLoraAdapterRequest(lora_name="b", lora_path=str(good["b"])), timeout=10)
    assert [a.name for a in loaded.adapters] == ["a", "b"]
    assert generate(worker, "b").token_ids == reference(model, load_adapter(good["b"], model.config, 16))
    worker.stub.UnloadLoraAdapter(pb.UnloadLoraAdapterRequest(lora_name="a"), timeout=10)
    assert len(collect(running_stream).token_ids) == 40
    with pytest.raises(grpc.RpcError):
        generate(worker, "a")
    assert len(collect(long).token_ids) == 200
    with pytest.raises(grpc.RpcError) as info:
        worker.stub.UnloadLoraAdapter(pb.UnloadLoraAdapterRequest(lora_name="a"), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND

    metrics = urllib.request.urlopen(f"http://127.0.0.1:{worker.metrics_port}/metrics", timeout=5).read().decode()
    assert 'vllm:lora_requests_info{max_lora="2"' in metrics
    assert 'mindmotor_lora_requests_total{lora_name="a"} 2.0' in metrics


def test_lora_off_refuses_loads(worker, adapters):
    good, _, _ = adapters
    with pytest.raises(grpc.RpcError) as info:
        worker.stub.LoadLoraAdapter(pb.LoadLoraAdapterRequest(lora_name="a", lora_path=str(good["a"])), timeout=5)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert not worker.stub.ListLoraAdapters(pb.ListLoraAdaptersRequest(), timeout=5).enabled
