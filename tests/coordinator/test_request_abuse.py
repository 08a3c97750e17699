"""What an attacker sent the front door (issue 19), through the real coordinator and workers:
structured-output specs that crashed the coordinator (SIGSEGV) in every field that carries one, a
~70 KB GBNF grammar, thousands of tools, a megabyte prompt. Each gets a 200 or a 4xx naming its
field and limit; the coordinator's helper processes take the crashes; every worker serves on."""

from __future__ import annotations

import json

import httpx
import pytest

from abuse_specs import chained_lark, large_gbnf, nested_schema, optional_chain, ref_chain, tools

from .processes import wait_until


def post(c, path: str, body: dict) -> httpx.Response:
    return httpx.post(c.url + path, content=json.dumps(body), timeout=120,
                      headers={"content-type": "application/json"})


def chat(model: str, **fields) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}


def completion(model: str, **fields) -> dict:
    return {"model": model, "prompt": "hi", "max_tokens": 4, **fields}


CASES = {
    "guided_grammar: a 3,000-rule chain": (
        "completions", lambda m: completion(m, guided_grammar=chained_lark(3000)), 400, "guided_grammar",
        "grammar_too_large"),
    "structured_outputs.grammar: overflows a helper's stack": (
        "completions", lambda m: completion(m, structured_outputs={"grammar": optional_chain(1997)}), 400,
        "structured_outputs", "structured_output_too_complex"),
    "response_format: a 2,500-deep $ref chain": (
        "chat/completions", lambda m: chat(m, response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": ref_chain(2500)}}), 400, "response_format", "schema_too_large"),
    "a forced tool whose parameters nest 100 deep": (
        "chat/completions", lambda m: chat(m, tools=tools(1, nested_schema(100)), tool_choice="required"), 400,
        "tools", "schema_too_deep"),
    "5,000 tools": (
        "chat/completions", lambda m: chat(m, tools=tools(5000)), 400, "tools", "too_many_tools"),
    "a 1 MB prompt (beyond the tiny model's context: refused before it is tokenized)": (
        "completions", lambda m: completion(m, prompt="def f(x):\n    return x\n" * 40_000), 400, "prompt",
        "context_length_exceeded"),
    "a 1 MB chat message": (
        "chat/completions", lambda m: chat(m, messages=[{"role": "user", "content": "x = 1\n" * 140_000}]), 400,
        "messages", "context_length_exceeded"),
}


@pytest.mark.parametrize("endpoint, body, status, param, code", CASES.values(), ids=CASES.keys())
def test_abuse_is_a_4xx_naming_the_field(coordinator, virtual_workers, model_name, endpoint, body, status, param,
                                         code):
    response = post(coordinator, f"/v1/{endpoint}", body(model_name))
    assert response.status_code == status, response.text[:300]
    error = response.json()["error"]
    assert error["param"] == param and (code is None or error["code"] == code), error
    served = post(coordinator, "/v1/completions", completion(model_name, temperature=0))
    assert served.status_code == 200, served.text
    assert all(w.proc.poll() is None for w in virtual_workers)


def test_a_large_gbnf_grammar_compiles_off_the_loop_or_is_refused(coordinator, model_name):
    """The ~70 KB GBNF grammar took 10–15 s on the coordinator's event loop; now a helper compiles
    it (or gives up after `spec_timeout_s`: a 400) while /health answers."""
    response = post(coordinator, "/v1/completions", completion(model_name, guided_grammar=large_gbnf()))
    assert response.status_code in (200, 400), response.text[:300]
    if response.status_code == 400:
        assert response.json()["error"]["param"] == "guided_grammar"


def test_the_helpers_are_replaced_after_a_crash_and_counted(coordinator, model_name):
    before = _restarts(coordinator)
    spec = optional_chain(1995)          # a new spec: not in the verdict cache
    response = post(coordinator, "/v1/completions", completion(model_name, guided_grammar=spec))
    assert response.status_code == 400 and "crashed" in response.json()["error"]["message"]
    assert _restarts(coordinator) == before + 1
    pool = coordinator.coordinator.specs.pool
    wait_until(lambda: pool.live == pool.size, what="the helper replaced")
    health = httpx.get(coordinator.url + "/health", timeout=10).json()
    assert health["spec_helpers"] == pool.size
    lag = httpx.get(coordinator.url + "/metrics", timeout=10).text
    assert "mindmotor_coordinator_event_loop_lag_seconds_count" in lag


def _restarts(c) -> float:
    return sum(s.value for m in c.coordinator.metrics.registry.collect() if m.name == "mindmotor_helper_restarts"
               for s in m.samples if s.name.endswith("_total") and s.labels["reason"] == "crashed")
