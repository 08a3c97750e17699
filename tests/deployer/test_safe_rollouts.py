"""Safe rollouts end to end (controller, deployer, coordinator, real replicas): a canary trained
with its own tokenizer is refused with both digests named — and, allowed, every request is
tokenized by the version that serves it (before the change: the canary's share failed with 400,
token ids outside its vocabulary); a fine-tuned canary (`train --init-from`) passes the check; a
canary that fails its requests is rolled back by the canary analysis with the figures in the
reason, shown by `mindmotor deploy get`; responses name the version and instance that served them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import grpc
import httpx
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from mindmotor.common.tokenizer import Tokenizer, TokenizerFiles
from mindmotor.common.waiting import wait_until
from mindmotor.trainer.testing import write_corpus

PROMPT = "def fibonacci(n):\n    return n"


def train(out, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mindmotor.cli", "train", "--preset", "tiny", "--out", str(out),
                           "--steps", "1", "--set", "checkpoint_interval=1", "--set", "eval_interval=1",
                           "--set", "warmup_steps=0", "--no-progress", "--run-name", "canary", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def own_tokenizer_ckpt(tmp_path_factory, corpus):
    """`mindmotor train --preset tiny`: a tokenizer of its own, with a smaller vocabulary (300)."""
    out = tmp_path_factory.mktemp("own")
    done = train(out, "--corpus", str(corpus), "--set", "vocab_size=300")
    assert done.returncode == 0, done.stderr
    return out / "canary-step000001"


@pytest.fixture(scope="module")
def fine_tuned_ckpt(tmp_path_factory, corpus, tiny_ckpt):
    out = tmp_path_factory.mktemp("fine-tuned")
    done = train(out, "--corpus", str(corpus), "--init-from", str(tiny_ckpt))
    assert done.returncode == 0, done.stderr
    return out / "canary-step000001"


@pytest.fixture(scope="module")
def small_vocab_ckpt(tiny_ckpt, tmp_path_factory):
    """The tiny checkpoint (same tokenizer) with its vocabulary cut to 260 ids: its worker refuses
    every prompt with a token id above — a canary that fails its requests."""
    directory = tmp_path_factory.mktemp("small-vocab") / "ckpt"
    shutil.copytree(tiny_ckpt, directory)
    config = json.loads((directory / "config.json").read_text())
    config["vocab_size"] = 260
    (directory / "config.json").write_text(json.dumps(config))
    tensors = load_file(directory / "model.safetensors")
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name in tensors:
            tensors[name] = np.ascontiguousarray(tensors[name][:260])
    save_file(tensors, directory / "model.safetensors")
    return directory


def complete(url: str, model: str, stream: bool = False) -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 2, "temperature": 0, "stream": stream}
    return httpx.post(f"{url}/v1/completions", json=body, timeout=30)


def start(cluster, *deployer_args: str, discovered: bool = False):
    """Controller, coordinator (the model's tokenizer from its directory, or `discovered` from the
    workers), deployer, and v1 serving."""
    cluster.start_controller()
    if discovered:
        coordinator = cluster.spawn("coordinator", ["coordinator", "--host", "127.0.0.1", "--port", "0",
                                                    "--controller", cluster.controller_address, "--access-log"],
                                    "MINDMOTOR_COORDINATOR_READY")
    else:
        coordinator = cluster.start_coordinator("--access-log")     # the access log is read below
    url = f"http://127.0.0.1:{coordinator.ready['port']}"
    client = cluster.client(cluster.start_deployer(*deployer_args))
    client.apply(cluster.spec({"name": "v1", "replicas": 1}, traffic={"v1": 100}))
    cluster.wait_ready("v1", 1)
    wait_until(lambda: complete(url, cluster.model).status_code == 200, timeout=30, what="v1 to serve")
    return client, url, coordinator


def access_log(coordinator) -> dict[str, dict]:
    """request id -> the coordinator's access log line of that request."""
    lines = []
    for line in coordinator.log_path.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return {entry["request_id"]: entry for entry in lines if entry.get("msg") == "request" and "request_id" in entry}


@pytest.mark.parametrize("discovered", [False, True], ids=["local-model", "discovered-model"])
def test_a_canary_with_its_own_tokenizer_is_refused_or_served_with_it(cluster, own_tokenizer_ckpt, tiny_ckpt,
                                                                      discovered):
    client, url, coordinator = start(cluster, discovered=discovered)
    serving, own = (TokenizerFiles.read(d).digest() for d in (tiny_ckpt, own_tokenizer_ckpt))
    assert serving != own

    with pytest.raises(grpc.RpcError) as refused:
        client.rollout(cluster.deployment, "v2", checkpoint=str(own_tokenizer_ckpt), canary=50)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert serving in refused.value.details() and own in refused.value.details()
    assert "--allow-tokenizer-change" in refused.value.details()
    assert not client.get(cluster.deployment).HasField("rollout")

    client.rollout(cluster.deployment, "v2", checkpoint=str(own_tokenizer_ckpt), canary=50,
                   allow_tokenizer_change=True)
    canary = client.wait_rollout(cluster.deployment, timeout_s=60)
    assert canary.rollout.phase == "canary" and canary.rollout.tokenizer_change, canary.rollout.reason
    wait_until(lambda: {i for i, v in httpx.get(f"{url}/health", timeout=5).json()["instances"].items()
                        if v["routable"]} >= {f"{cluster.deployment}-v1-0", f"{cluster.deployment}-v2-0"}
               and httpx.get(f"{url}/health", timeout=5).json()["traffic"].get(cluster.model) == {"v1": 50, "v2": 50},
               timeout=30, what="the coordinator to route to both versions")

    prompt_tokens = {"v1": len(Tokenizer.from_dir(tiny_ckpt).encode(PROMPT)),
                     "v2": len(Tokenizer.from_dir(own_tokenizer_ckpt).encode(PROMPT))}
    assert prompt_tokens["v1"] != prompt_tokens["v2"]
    served, logged = {"v1": 0, "v2": 0}, {}
    for i in range(16):
        r = complete(url, cluster.model, stream=i % 2 == 1)
        assert r.status_code == 200, r.text                 # before: v2's share answered 400
        version, instance = r.headers["x-mindmotor-version"], r.headers["x-mindmotor-instance"]
        assert instance == f"{cluster.deployment}-{version}-0"
        served[version] += 1
        logged[r.headers["x-request-id"]] = (instance, version)
        if i % 2 == 0:                                      # tokenized with the tokenizer of the version
            assert r.json()["usage"]["prompt_tokens"] == prompt_tokens[version]
        else:
            assert "[DONE]" in r.text and '"error"' not in r.text
    assert served == {"v1": 8, "v2": 8}
    wait_until(lambda: set(logged) <= set(access_log(coordinator)), what="the access log lines")
    lines = access_log(coordinator)
    assert {rid: (lines[rid]["instance"], lines[rid]["version"]) for rid in logged} == logged

    client.promote(cluster.deployment)                      # v2 alone: still tokenized with its tokenizer
    cluster.wait_gone("v1")
    wait_until(lambda: set(httpx.get(f"{url}/health", timeout=5).json()["instances"]) == {f"{cluster.deployment}-v2-0"},
               timeout=30, what="the coordinator to see v1 gone")
    for _ in range(4):
        r = complete(url, cluster.model)
        assert r.status_code == 200, r.text
        assert r.headers["x-mindmotor-version"] == "v2" and r.json()["usage"]["prompt_tokens"] == prompt_tokens["v2"]


def test_a_fine_tuned_canary_keeps_the_tokenizer_and_passes_the_check(cluster, fine_tuned_ckpt):
    client, url, _ = start(cluster)
    client.rollout(cluster.deployment, "v2", checkpoint=str(fine_tuned_ckpt), canary=50)
    canary = client.wait_rollout(cluster.deployment, timeout_s=60)
    assert canary.rollout.phase == "canary" and not canary.rollout.tokenizer_change, canary.rollout.reason


def test_a_failing_canary_is_rolled_back_by_the_analysis(cluster, small_vocab_ckpt):
    cluster.start_controller()
    coordinator = cluster.start_coordinator()
    url = f"http://127.0.0.1:{coordinator.ready['port']}"
    deployer = cluster.start_deployer("--coordinator", url, "--analysis-min-requests", "4",
                                      "--analysis-window", "30")
    client = cluster.client(deployer)
    client.apply(cluster.spec({"name": "v1", "replicas": 1}, traffic={"v1": 100}))
    cluster.wait_ready("v1", 1)
    wait_until(lambda: complete(url, cluster.model).status_code == 200, timeout=30, what="v1 to serve")

    client.rollout(cluster.deployment, "v2", checkpoint=str(small_vocab_ckpt), canary=50,
                   analysis={"max_error_rate_increase": 0.2})
    assert client.wait_rollout(cluster.deployment, timeout_s=60).rollout.phase == "canary"

    statuses = []

    def rolled_back() -> bool:
        r = complete(url, cluster.model)
        statuses.append((r.status_code, r.headers.get("x-mindmotor-version")))
        return client.get(cluster.deployment).rollout.phase == "failed"

    wait_until(rolled_back, timeout=60, what="the canary analysis to roll v2 back")
    assert (400, "v2") in statuses and (200, "v1") in statuses
    assert all(code == 200 for code, version in statuses if version == "v1")
    failed = client.get(cluster.deployment)
    reason = failed.rollout.reason
    assert reason.startswith("canary analysis: error rate of v2 100.0% exceeds v1's 0.0% by more than the margin "
                             "of 20.0 points") and reason.endswith("rolled back"), reason
    assert [v.name for v in failed.spec.versions] == ["v1"] and dict(failed.spec.traffic) == {"v1": 100}

    shown = subprocess.run([sys.executable, "-m", "mindmotor.cli", "deploy", "get", cluster.deployment,
                            "--deployer", f"127.0.0.1:{deployer.ready['port']}"],
                           capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert f"rollout v2 (replacing v1): failed — {reason}" in shown.stdout
    wait_until(lambda: all(complete(url, cluster.model).status_code == 200 for _ in range(4)), timeout=30,
               what="every request to succeed once v2 is gone")
