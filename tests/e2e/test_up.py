"""`mindmotor up` as a user runs it: the official openai client against the whole platform
(controller, deployer with two workers, coordinator as real processes), then Ctrl-C stops everything."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import openai
import pytest

from mindmotor.runtime.child_process import ChildProcess
from mindmotor.runtime.proc_tree import child_pids, descendants, running

from .conftest import wait_until


@pytest.fixture(scope="module")
def platform(e2e_model, tmp_path_factory):
    logs = tmp_path_factory.mktemp("up")
    up = ChildProcess("up", ["up", "--model", str(e2e_model), "--port", "0", "--timing", "virtual",
                             "--workers", "2", "--state-dir", str(logs / "state")], "MINDMOTOR_UP_READY", logs / "up.log")
    try:
        up.wait_ready(180)
        yield up
    finally:
        up.stop(60)          # SIGTERM: the platform drains and stops its children


@pytest.fixture(scope="module")
def client(platform):
    return openai.OpenAI(base_url=platform.ready["url"] + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model(client, e2e_model):
    (model,) = client.models.list().data
    assert model.id == e2e_model.name and model.owned_by == "mindmotor"


def test_completions_chat_streaming_n_and_stop(client, e2e_model):
    name = e2e_model.name
    greedy = client.completions.create(model=name, prompt="def add(a, b):", max_tokens=12, temperature=0)
    assert greedy.choices[0].finish_reason in ("length", "stop") and greedy.usage.prompt_tokens > 0
    assert 0 < greedy.usage.completion_tokens <= 12

    chunks = list(client.completions.create(model=name, prompt="def add(a, b):", max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == greedy.choices[0].text
    assert chunks[-1].usage.completion_tokens == greedy.usage.completion_tokens

    several = client.completions.create(model=name, prompt="x =", max_tokens=5, n=3, temperature=1.0, seed=7)
    assert sorted(c.index for c in several.choices) == [0, 1, 2]

    stop = greedy.choices[0].text[3:6]
    stopped = client.completions.create(model=name, prompt="def add(a, b):", max_tokens=12, temperature=0,
                                        stop=[stop])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == greedy.choices[0].text[:greedy.choices[0].text.find(stop)]

    chat = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=8, temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.usage.total_tokens > 0


def test_errors_use_the_openai_body(client, e2e_model):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=e2e_model.name, prompt="hi", max_tokens=10**6)
    assert "maximum context length" in info.value.body["message"]
    with pytest.raises(openai.NotFoundError) as info:       # 404 model_not_found, as OpenAI and vLLM
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=1)
    assert "no-such-model" in info.value.body["message"]
    assert info.value.body["code"] == "model_not_found"


def test_ctrl_c_drains_a_stream_and_stops_every_service(e2e_model, tmp_path):
    up = ChildProcess("up", ["up", "--model", str(e2e_model), "--port", "0", "--timing", "virtual",
                             "--workers", "1", "--state-dir", str(tmp_path / "state")], "MINDMOTOR_UP_READY",
                      tmp_path / "up.log")
    try:
        up.wait_ready(180)
        children = child_pids(up.proc.pid)
        # controller, deployer, two coordinator replicas, and the deployer's worker: up's child, so
        # that it outlives a deployer death (adopted by the restarted deployer) and dies with up
        assert len(children) == 5
        everything = descendants(up.proc.pid)
        # nothing else: the structured-output spec helpers start with the first such request
        assert sorted(everything) == sorted(children), [_cmdline(p) for p in everything]
        assert all(os.getpgid(pid) != os.getpgid(up.proc.pid) for pid in children)   # groups of their own
        # Ctrl-C in up's terminal (SIGINT to its process group) mid-stream: up alone gets it and
        # drains in order, so the stream finishes whole
        client = openai.OpenAI(base_url=up.ready["url"] + "/v1", api_key="unused", max_retries=0)
        stream = client.completions.create(model=e2e_model.name, prompt="def add(a, b):", max_tokens=48,
                                           temperature=0, stream=True, extra_body={"ignore_eos": True},
                                           stream_options={"include_usage": True})
        chunks = iter(stream)
        next(chunks)
        os.killpg(up.proc.pid, signal.SIGINT)
        rest = list(chunks)
        assert [c.choices[0].finish_reason for c in rest if c.choices][-1] == "length"
        assert rest[-1].usage.completion_tokens == 48
        assert up.proc.wait(60) == 0
        assert not [pid for pid in everything if running(pid)]
    finally:
        up.kill()


def test_killing_the_supervisor_takes_its_services_down(e2e_model, tmp_path):
    """Even SIGKILL of `mindmotor up` leaves no service behind (they get SIGTERM from the kernel)."""
    up = ChildProcess("up", ["up", "--model", str(e2e_model), "--port", "0", "--timing", "virtual",
                             "--workers", "1", "--state-dir", str(tmp_path / "state")], "MINDMOTOR_UP_READY",
                      tmp_path / "up.log")
    try:
        up.wait_ready(180)
        children = descendants(up.proc.pid)
        up.proc.kill()
        up.proc.wait(10)
        wait_until(lambda: not [pid for pid in children if running(pid)], timeout=60,
                   what="the orphaned services to exit")
    finally:
        up.kill()


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
