"""vLLM's extra sampling fields over HTTP: implemented ones reach the engine through the worker
(the output equals the offline engine's with the same field), unimplemented ones that would
change the output are refused with a 400 naming them — never silently dropped."""

from __future__ import annotations

import httpx
import pytest

from mindmotor import LLM, SamplingParams

PROMPT = "def add(a, b):\n    return"


@pytest.fixture(scope="module")
def http(coordinator):
    with httpx.Client(base_url=coordinator.url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def offline(tiny_ckpt):
    return LLM(model=str(tiny_ckpt), block_size=4)


@pytest.mark.parametrize("fields", [
    dict(repetition_penalty=1.7),
    dict(logit_bias={"7": 3.0, "12": -100}),
    dict(allowed_token_ids=[5, 9, 40, 41, 300]),
    dict(bad_words="a piece of the plain output"),
    dict(min_p=0.2, temperature=1.0, seed=11),
])
def test_field_reaches_the_engine(http, model_name, offline, fields):
    plain_ids = offline.generate([PROMPT], SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.0)
                                 )[0].token_ids
    if "bad_words" in fields:
        tok = offline.engine.tokenizer            # a two-token piece whose text tokenizes back to it
        i = next(i for i in range(1, 8) if tok.encode(tok.decode(plain_ids[i:i + 2])) == plain_ids[i:i + 2])
        fields = {"bad_words": [tok.decode(plain_ids[i:i + 2])]}
    body = {"model": model_name, "prompt": PROMPT, "max_tokens": 10, "ignore_eos": True, "temperature": 0.0,
            **fields}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    kwargs = {k: v for k, v in body.items() if k not in ("model", "prompt")}
    if "logit_bias" in kwargs:
        kwargs["logit_bias"] = {int(k): v for k, v in kwargs["logit_bias"].items()}
    expected = offline.generate([PROMPT], SamplingParams(**kwargs))[0].text
    assert response.json()["choices"][0]["text"] == expected
    plain = offline.generate([PROMPT], SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.0,
                                                      seed=fields.get("seed")))[0].text
    if "min_p" not in fields:
        assert expected != plain                       # the field changed the output


def test_chat_takes_the_fields_too(http, model_name):
    body = {"model": model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "temperature": 0, "logit_bias": {"11": 100}}
    text = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
    assert text == http.post("/detokenize", json={"model": model_name, "tokens": [11] * 4}).json()["prompt"]


CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("path, extra, param", [
    ("/v1/completions", {"guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
    ("/v1/chat/completions", {"structural_tag": {"type": "structural_tag"}}, "structural_tag"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {}}]}, "tools.0.function.name"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}],
                              "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions"),
    ("/v1/chat/completions", {"tool_choice": "required"}, "tool_choice"),
    ("/v1/chat/completions", {"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    ("/v1/completions", {"use_beam_search": True}, "use_beam_search"),
    ("/v1/completions", {"spaces_between_special_tokens": False}, "spaces_between_special_tokens"),
    ("/v1/completions", {"prompt_embeds": ["AAAA"]}, "prompt_embeds"),
    ("/v1/chat/completions", {"chat_template": "{{ messages }}"}, "chat_template"),
    ("/v1/chat/completions", {"continue_final_message": True}, "continue_final_message"),   # with add_generation_prompt
    ("/v1/completions", {"allowed_token_ids": []}, "allowed_token_ids"),
    ("/v1/completions", {"min_p": 1.5}, "min_p"),
    ("/v1/completions", {"repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/completions", {"logit_bias": {"5": 200}}, "logit_bias"),
    ("/v1/completions", {"allowed_token_ids": [10**6]}, "allowed_token_ids"),
])
def test_unimplemented_or_bad_fields_are_400_naming_them(http, model_name, path, extra, param):
    body = {"model": model_name, **({"prompt": "hi"} if path == "/v1/completions" else CHAT), **extra}
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and param in error["message"]


def test_legacy_function_call_in_the_history_is_refused(http, model_name):
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}}]
    response = http.post("/v1/chat/completions", json={"model": model_name, "messages": messages})
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages.1.function_call"


def test_neutral_values_are_accepted(http, model_name):
    body = {"model": model_name, **CHAT, "max_tokens": 2, "response_format": {"type": "text"},
            "tool_choice": "none", "tools": [], "skip_special_tokens": True, "use_beam_search": False}
    assert http.post("/v1/chat/completions", json=body).status_code == 200


def test_unseeded_choices_differ_and_a_seed_reproduces_on_any_worker(http, model_name, make_coordinator,
                                                                     virtual_workers):
    """Unseeded sampling draws fresh entropy per request (every worker used to seed its engine with 0,
    so the same prompt gave the same "random" text everywhere); one seed gives one text wherever the
    request runs (repeated requests through a round-robin coordinator: both workers, in turn — the
    shared coordinator's least_load may keep an idle pair's requests on one)."""
    body = {"model": model_name, "prompt": PROMPT, "max_tokens": 12, "ignore_eos": True, "temperature": 1.0}
    unseeded = http.post("/v1/completions", json={**body, "n": 4})
    assert unseeded.status_code == 200, unseeded.text
    assert len({c["text"] for c in unseeded.json()["choices"]}) > 1
    assert http.post("/v1/completions", json=body).json()["choices"][0]["text"] != \
        http.post("/v1/completions", json=body).json()["choices"][0]["text"]
    turns = make_coordinator(workers=[w.address for w in virtual_workers], policy="round_robin")
    with httpx.Client(base_url=turns.url, timeout=60) as in_turn:
        seeded = [in_turn.post("/v1/completions", json={**body, "seed": 21}) for _ in range(4)]
    assert len({r.json()["choices"][0]["text"] for r in seeded}) == 1
    assert len({r.headers["x-mindmotor-instance"] for r in seeded}) == 2     # ran on both workers
