"""`mindmotor up --config` with `roles: [prefill, decode]`: the coordinator splits every request
between the two workers (the prompt on one, the decode on the other, the KV pulled between them),
and greedy completions equal the offline `mindmotor.LLM` token for token."""

from __future__ import annotations

import re

import httpx
import openai
import pytest
import yaml
from pydantic import ValidationError

from mindmotor import LLM, SamplingParams
from mindmotor.launcher.config import PlatformConfig
from mindmotor.runtime.child_process import ChildProcess

PROMPTS = ["def fibonacci(n):", "The prefill worker reads this prompt and the decode worker"]
MAX_TOKENS = 16


def test_up_with_a_prefill_and_a_decode_worker(e2e_model, tmp_path):
    config = tmp_path / "up-pd.yaml"
    config.write_text(yaml.safe_dump({
        "port": 0, "state_dir": str(tmp_path / "state"), "log_dir": str(tmp_path / "logs"),
        "models": [{"path": str(e2e_model), "timing": "virtual", "roles": ["prefill", "decode"], "node": "n0"}]}))
    up = ChildProcess("up", ["up", "--config", str(config)], "MINDMOTOR_UP_READY", tmp_path / "up.log")
    try:
        url = up.wait_ready(180)["url"]
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        served = [client.completions.create(model=e2e_model.name, prompt=p, max_tokens=MAX_TOKENS, temperature=0,
                                            extra_body={"ignore_eos": True}).choices[0].text for p in PROMPTS]
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model=e2e_model.name, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0, stream=True,
            extra_body={"ignore_eos": True}) if c.choices)
        metrics = httpx.get(url + "/metrics", timeout=5).text
    finally:
        assert up.stop(60) == 0

    offline = LLM(model=str(e2e_model)).generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                                                                         ignore_eos=True))
    assert served == [o.text for o in offline]
    assert streamed == served[0]
    prefilled = re.search(r'mindmotor_coordinator_pd_prefills_total\{model="[^"]+"\} (\S+)', metrics)
    assert prefilled and float(prefilled.group(1)) == len(PROMPTS) + 1
    assert "mindmotor_coordinator_pd_fallbacks_total{" not in metrics
    # the deployer's replicas: slot 0 the prefill worker, slot 1 the decode worker
    worker_logs = {p.name.rsplit("-", 1)[1]: p.read_text() for p in (tmp_path / "logs" / "workers").glob("*-v1-*.log")}
    for slot, role in (("0.log", "prefill"), ("1.log", "decode")):
        ready = next(line for line in worker_logs[slot].splitlines() if '"worker ready"' in line)
        assert f'"role": "{role}"' in ready and '"node": "n0"' in ready
    assert worker_logs["0.log"].count('"prefill done"') == len(PROMPTS) + 1


def test_roles_set_the_worker_count_and_must_be_known():
    spec = PlatformConfig.model_validate({"models": [{"roles": ["prefill", "prefill", "decode"]}]}).models[0]
    assert spec.workers == 3 and [spec.role_of(w) for w in range(3)] == ["prefill", "prefill", "decode"]
    assert PlatformConfig().models[0].role_of(1) == "mixed"
    for bad in ({"roles": ["prefill", "tensor"]}, {"roles": ["prefill"], "workers": 2}, {"roles": []}):
        with pytest.raises(ValidationError):
            PlatformConfig.model_validate({"models": [bad]})
