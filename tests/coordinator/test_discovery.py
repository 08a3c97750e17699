"""Model discovery: a coordinator without a local checkpoint for a model learns its tokenizer and
chat template from the workers that serve it (ModelInfo) — from static workers or the
controller's routing table — and serves it exactly as with `--model NAME=DIR`; a local directory
wins; a model not (yet) discovered is the usual `model_not_found`; a failed ModelInfo is retried
with a growing backoff; instances with different tokenizers are counted, and a discovered model no
instance serves is learnt again or forgotten."""

from __future__ import annotations

import json
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import pytest

from mindmotor.common.roles import Role
from mindmotor.common.tokenizer import Tokenizer, TokenizerFiles
from mindmotor.protocol import worker_pb2 as pb
from mindmotor.protocol import worker_pb2_grpc
from mindmotor.worker.model_info import read_model_info

from .processes import (CoordinatorProcess, InProcessCoordinator, WorkerProcess, start_controller, start_workers,
                        wait_until)

MESSAGES = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "def add(a, b):"}]


def discovery_count(http: httpx.Client, model: str, outcome: str) -> float:
    text = http.get("/metrics").text
    m = re.search(rf'^mindmotor_coordinator_model_discovery_total\{{model="{re.escape(model)}",'
                  rf'outcome="{outcome}"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def model_ids(http: httpx.Client) -> list[str]:
    return [m["id"] for m in http.get("/v1/models").json()["data"]]


def chat_tokens(directory: Path) -> list[int]:
    """The prompt tokens of MESSAGES with the chat template of `directory`."""
    tokenizer = Tokenizer.from_dir(directory)
    return tokenizer.encode(tokenizer.apply_chat_template(MESSAGES))


def tokenize_chat(http: httpx.Client, model: str) -> list[int]:
    r = http.post("/tokenize", json={"model": model, "messages": MESSAGES})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def with_chat_template(source: Path, target: Path, template: str, everything: bool = False) -> Path:
    """A copy of `source` (its tokenizer files only, or the whole checkpoint) with another chat template."""
    if everything:
        shutil.copytree(source, target)
    else:
        target.mkdir()
        shutil.copy(source / "tokenizer.json", target)
    config = json.loads((source / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    return target


def same_output(a: dict, b: dict) -> bool:
    """The same choices and token counts (cached tokens differ: the second request hits the cache)."""
    counts = ("prompt_tokens", "completion_tokens")
    return a["choices"] == b["choices"] and [a["usage"][k] for k in counts] == [b["usage"][k] for k in counts]


def model_not_found(response: httpx.Response, status: int = 404) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    return error


@pytest.fixture(scope="module")
def discovering(virtual_workers):
    """A coordinator with no model configured, over the two shared workers."""
    c = InProcessCoordinator(workers=[w.address for w in virtual_workers])
    with httpx.Client(base_url=c.url, timeout=30) as http:
        yield http
    c.stop()


# ---- the tokenizer from files --------------------------------------------------------------------
def test_a_tokenizer_from_files_is_the_tokenizer_from_the_directory(tiny_ckpt):
    files = TokenizerFiles.read(tiny_ckpt)
    from_files, from_dir = Tokenizer.from_files(files, "a worker"), Tokenizer.from_dir(tiny_ckpt)
    assert from_files.apply_chat_template(MESSAGES) == from_dir.apply_chat_template(MESSAGES)
    assert from_files.encode("def f(): return 1") == from_dir.encode("def f(): return 1")
    assert from_files.eos_token_ids == from_dir.eos_token_ids
    assert files.digest() == TokenizerFiles.read(tiny_ckpt).digest()
    assert TokenizerFiles(files.tokenizer_json).digest() != files.digest()
    with pytest.raises(ValueError, match="a worker/tokenizer.json: cannot be loaded"):
        Tokenizer.from_files(TokenizerFiles(b"{not json"), "a worker")


# ---- static workers ------------------------------------------------------------------------------
def test_without_models_the_workers_model_is_served_as_if_configured(discovering, virtual_workers, tiny_ckpt,
                                                                     model_name):
    configured = InProcessCoordinator(workers=[w.address for w in virtual_workers],
                                      models={model_name: str(tiny_ckpt)})
    try:
        wait_until(lambda: model_ids(discovering) == [model_name], what="the workers' model to be discovered")
        (card,) = discovering.get("/v1/models").json()["data"]
        assert (card["root"], card["max_model_len"]) == (model_name, 1024)
        with httpx.Client(base_url=configured.url, timeout=30) as local:
            for path, body in [("/v1/completions", {"prompt": "def fibonacci(n):"}),
                               ("/v1/chat/completions", {"messages": MESSAGES})]:
                body = {"model": model_name, "max_tokens": 12, "temperature": 0, **body}
                a, b = discovering.post(path, json=body), local.post(path, json=body)
                assert a.status_code == b.status_code == 200, (a.text, b.text)
                assert same_output(a.json(), b.json())
            assert tokenize_chat(discovering, model_name) == tokenize_chat(local, model_name) == chat_tokens(tiny_ckpt)
    finally:
        configured.stop()
    assert discovery_count(discovering, model_name, "discovered") == 1
    wait_until(lambda: discovery_count(discovering, model_name, "matched") == 1,
               what="the second worker to be checked against the first")


def test_an_unknown_model_is_still_model_not_found(discovering, model_name):
    wait_until(lambda: model_ids(discovering) == [model_name], what="the workers' model to be discovered")
    error = model_not_found(discovering.post("/v1/completions", json={"model": "gpt-9", "prompt": "hi"}))
    assert error["type"] == "invalid_request_error" and model_name in error["message"]
    model_not_found(discovering.post("/tokenize", json={"model": "gpt-9", "prompt": "hi"}))
    model_not_found(discovering.get("/v1/models/gpt-9"), status=404)


def test_a_local_directory_wins_over_what_the_workers_report(virtual_workers, tiny_ckpt, model_name, tmp_path):
    local = with_chat_template(tiny_ckpt, tmp_path / "local",
                               "{% for m in messages %}LOCAL {{ m['content'] }}\n{% endfor %}")
    c = InProcessCoordinator(workers=[virtual_workers[0].address], models={model_name: str(local)})
    try:
        with httpx.Client(base_url=c.url, timeout=30) as http:
            wait_until(lambda: discovery_count(http, model_name, "local_differs") == 1,
                       what="the worker's tokenizer to be checked against the local one")
            assert tokenize_chat(http, model_name) == chat_tokens(local) != chat_tokens(tiny_ckpt)
            assert http.get(f"/v1/models/{model_name}").json()["root"] == model_name   # never the local path
            assert discovery_count(http, model_name, "discovered") == 0
    finally:
        c.stop()


def test_different_tokenizers_are_counted_and_a_model_is_relearnt_then_forgotten(tiny_ckpt, tmp_path):
    """Two workers serve "shared" with different chat templates: the first one discovered is kept
    (a conflict counted); once it is gone, the remaining worker's tokenizer is learnt after the
    grace time; once no worker is left, the model is served 503 until the grace time ends, then it
    no longer exists."""
    dirs = [with_chat_template(tiny_ckpt, tmp_path / name, f"{{% for m in messages %}}[{name}] {{{{ m['content'] }}}}"
                               "{% endfor %}", everything=True) for name in ("one", "two")]
    workers = [WorkerProcess(d, tmp_path / f"{d.name}.log", "--timing", "virtual", "--served-model-name", "shared")
               for d in dirs]
    c = None
    try:
        for w in workers:
            w.wait_ready()
        c = InProcessCoordinator(workers=[w.address for w in workers], status_interval_s=0.1, status_timeout_s=0.5,
                                 discovery_forget_s=1.5)
        with httpx.Client(base_url=c.url, timeout=30) as http:
            wait_until(lambda: discovery_count(http, "shared", "conflict") == 1, what="the conflict to be seen")
            assert discovery_count(http, "shared", "discovered") == 1
            first = [chat_tokens(d) for d in dirs].index(tokenize_chat(http, "shared"))

            workers[first].kill()
            wait_until(lambda: tokenize_chat(http, "shared") == chat_tokens(dirs[1 - first]), timeout=30,
                       what="the remaining worker's tokenizer to be learnt")
            assert discovery_count(http, "shared", "discovered") == 2

            workers[1 - first].kill()
            body = {"model": "shared", "prompt": "hi", "max_tokens": 2}
            wait_until(lambda: http.post("/v1/completions", json=body).status_code == 503, timeout=30,
                       what="no instance left for the model")
            wait_until(lambda: model_ids(http) == [], timeout=30, what="the model to be forgotten")
            model_not_found(http.post("/v1/completions", json=body))
            assert discovery_count(http, "shared", "forgotten") == 1
    finally:
        if c is not None:
            c.stop()
        for w in workers:
            w.stop()


class FlakyWorker(worker_pb2_grpc.WorkerServicer):
    """Serves "flaky" by its Status; its ModelInfo fails `failures` times, then answers."""

    def __init__(self, info: pb.ModelInfoResponse, failures: int):
        self.info = info
        self.failures = failures
        self.calls: list[float] = []

    def Status(self, request, context):
        return pb.StatusResponse(worker_id="flaky", model="flaky", max_model_len=1024, block_size=16,
                                 role=Role.MIXED.to_proto(), state="serving")

    def ModelInfo(self, request, context):
        self.calls.append(time.monotonic())
        if len(self.calls) <= self.failures:
            context.abort(grpc.StatusCode.UNAVAILABLE, "not yet")
        return self.info


def test_a_failed_model_info_is_retried_with_a_growing_backoff(tiny_ckpt):
    flaky = FlakyWorker(read_model_info(tiny_ckpt, "flaky", 1024), failures=2)
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    worker_pb2_grpc.add_WorkerServicer_to_server(flaky, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    c = None
    try:
        c = InProcessCoordinator(workers=[f"127.0.0.1:{port}"], discovery_backoff_s=0.1)
        with httpx.Client(base_url=c.url, timeout=30) as http:
            wait_until(lambda: model_ids(http) == ["flaky"], what="the model to be discovered after two failures")
            assert [discovery_count(http, "flaky", o) for o in ("failed", "discovered")] == [2, 1]
            assert tokenize_chat(http, "flaky") == chat_tokens(tiny_ckpt)
        first_wait, second_wait = (b - a for a, b in zip(flaky.calls, flaky.calls[1:3]))
        assert 0.1 <= first_wait and 0.2 <= second_wait
    finally:
        if c is not None:
            c.stop()
        server.stop(grace=None)


# ---- the controller's routing table ---------------------------------------------------------------
def test_a_model_registered_later_becomes_servable_without_a_restart(coordinator, model_name, tiny_ckpt, tmp_path):
    """`mindmotor coordinator --controller ADDR` and nothing else; a worker registers afterwards
    under `--served-model-name other` and is served as `other`, exactly as the configured model."""
    controller = start_controller(tmp_path / "controller.log", "--heartbeat-interval", "0.2")
    started = [controller]
    try:
        watching = CoordinatorProcess(tmp_path / "coordinator.log", "--controller", controller.address)
        started.append(watching)
        with httpx.Client(base_url=watching.url, timeout=30) as http:
            assert model_ids(http) == []
            model_not_found(http.post("/v1/completions", json={"model": "other", "prompt": "hi"}))

            started += start_workers(tiny_ckpt, tmp_path, 1, "--timing", "virtual", "--controller",
                                     controller.address, "--served-model-name", "other")
            wait_until(lambda: model_ids(http) == ["other"], timeout=30, what="the registered model to be discovered")
            body = {"max_tokens": 12, "temperature": 0, "messages": MESSAGES}
            r = http.post("/v1/chat/completions", json={"model": "other", **body})
            assert r.status_code == 200, r.text
            expected = httpx.post(f"{coordinator.url}/v1/chat/completions", json={"model": model_name, **body},
                                  timeout=30).json()
            assert same_output(r.json(), expected)
    finally:
        for process in reversed(started):
            process.stop()
