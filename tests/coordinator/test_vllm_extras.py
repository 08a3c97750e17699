"""vLLM's extras on the completions and chat APIs, over HTTP against real workers: return_token_ids,
truncate_prompt_tokens, skip_special_tokens, continue_final_message, chat echo, chat_template_kwargs
and documents, add_special_tokens; prompt_embeds and a tool message without tool_call_id are
refused; unknown fields are ignored and named (header and log line). The template and tokenizer
options are checked on a real tokenizer whose template and post-processor use them."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest
from tokenizers.processors import TemplateProcessing

from mindmotor.common.tokenizer import Tokenizer
from mindmotor.coordinator.http.errors import BadRequest
from mindmotor.coordinator.openai.prompts import TemplateOptions, chat_text, completion_prompts
from mindmotor.coordinator.openai.schemas import ChatMessage

PROMPT = "def add(a, b):\n    return"
USER = {"role": "user", "content": "hi"}


@pytest.fixture(scope="module")
def http(coordinator):
    with httpx.Client(base_url=coordinator.url, timeout=60) as client:
        yield client


def tokenize(http, model_name, **body) -> list[int]:
    return http.post("/tokenize", json={"model": model_name, **body}).json()["tokens"]


def detokenize(http, model_name, ids) -> str:
    return http.post("/detokenize", json={"model": model_name, "tokens": ids}).json()["prompt"]


def stream(http, path, body) -> list[dict]:
    with http.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        return [json.loads(line[6:]) for line in response.iter_lines()
                if line.startswith("data: ") and line != "data: [DONE]"]


def test_return_token_ids_on_completions(http, model_name):
    body = {"model": model_name, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    choice = http.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["prompt_token_ids"] == tokenize(http, model_name, prompt=PROMPT)
    assert len(choice["token_ids"]) == 6 and detokenize(http, model_name, choice["token_ids"]) == choice["text"]
    chunks = [c["choices"][0] for c in stream(http, "/v1/completions", body) if c["choices"]]
    assert chunks[0]["prompt_token_ids"] == choice["prompt_token_ids"]
    assert all("prompt_token_ids" not in c for c in chunks[1:])
    assert [t for c in chunks for t in c["token_ids"]] == choice["token_ids"]
    plain = http.post("/v1/completions", json={**body, "return_token_ids": False}).json()["choices"][0]
    assert "token_ids" not in plain and "prompt_token_ids" not in plain


def test_return_token_ids_on_chat(http, model_name):
    body = {"model": model_name, "messages": [USER], "max_tokens": 5, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    reply = http.post("/v1/chat/completions", json=body).json()
    assert reply["prompt_token_ids"] == tokenize(http, model_name, messages=[USER])
    assert len(reply["choices"][0]["token_ids"]) == 5
    chunks = stream(http, "/v1/chat/completions", body)
    assert chunks[0]["prompt_token_ids"] == reply["prompt_token_ids"]
    assert [t for c in chunks for ch in c["choices"] for t in ch.get("token_ids", [])] == \
        reply["choices"][0]["token_ids"]


def test_truncate_prompt_tokens_keeps_the_last_ones(http, model_name):
    ids = tokenize(http, model_name, prompt=PROMPT)
    body = {"model": model_name, "max_tokens": 4, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    cut = http.post("/v1/completions", json={**body, "prompt": PROMPT, "truncate_prompt_tokens": 3}).json()
    assert cut["usage"]["prompt_tokens"] == 3 and cut["choices"][0]["prompt_token_ids"] == ids[-3:]
    same = http.post("/v1/completions", json={**body, "prompt": ids[-3:]}).json()
    assert cut["choices"][0]["text"] == same["choices"][0]["text"]
    whole = http.post("/v1/completions", json={**body, "prompt": ids, "truncate_prompt_tokens": -1}).json()
    assert whole["usage"]["prompt_tokens"] == len(ids)
    chat = http.post("/v1/chat/completions", json={**body, "messages": [USER], "truncate_prompt_tokens": 2}).json()
    assert chat["usage"]["prompt_tokens"] == 2
    too_many = http.post("/v1/completions", json={**body, "prompt": PROMPT, "truncate_prompt_tokens": 10**6})
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "truncate_prompt_tokens"


def test_skip_special_tokens_false_keeps_them_in_the_text(http, model_name):
    (im_start,) = tokenize(http, model_name, prompt="<|im_start|>")
    body = {"model": model_name, "prompt": PROMPT, "max_tokens": 3, "temperature": 0,
            "logit_bias": {str(im_start): 100}}
    kept = http.post("/v1/completions", json={**body, "skip_special_tokens": False}).json()["choices"][0]["text"]
    assert kept == "<|im_start|>" * 3
    assert http.post("/v1/completions", json=body).json()["choices"][0]["text"] == ""
    streamed = stream(http, "/v1/completions", {**body, "skip_special_tokens": False})
    assert "".join(c["choices"][0]["text"] for c in streamed if c["choices"]) == kept


def test_continue_final_message_and_echo(http, model_name):
    messages = [USER, {"role": "assistant", "content": "The answer is"}]
    body = {"model": model_name, "messages": messages, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    refused = http.post("/v1/chat/completions", json={**body, "continue_final_message": True})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "continue_final_message"
    go = {**body, "continue_final_message": True, "add_generation_prompt": False}
    reply = http.post("/v1/chat/completions", json=go).json()
    prompt = detokenize(http, model_name, reply["prompt_token_ids"])
    assert prompt.endswith("assistant\nThe answer is")       # left open: no <|im_end|> after it
    assert reply["prompt_token_ids"] == tokenize(http, model_name, messages=messages, add_generation_prompt=False,
                                                 continue_final_message=True)
    message = reply["choices"][0]["message"]
    echoed = http.post("/v1/chat/completions", json={**go, "echo": True}).json()["choices"][0]["message"]
    assert message["role"] == echoed["role"] == "assistant"
    assert echoed["content"] == "The answer is" + message["content"]
    chunks = stream(http, "/v1/chat/completions", {**go, "echo": True})
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == echoed["content"]
    # with a generation prompt the reply's role (assistant) is not the last message's (user): nothing echoed
    plain = {"model": model_name, "messages": [USER], "max_tokens": 4, "temperature": 0, "ignore_eos": True}
    assert http.post("/v1/chat/completions", json={**plain, "echo": True}).json()["choices"][0]["message"] == \
        http.post("/v1/chat/completions", json=plain).json()["choices"][0]["message"]


@pytest.mark.parametrize("path, extra, param", [
    ("/v1/completions", {"prompt_embeds": "AAAA"}, "prompt_embeds"),
    ("/v1/chat/completions", {"messages": [USER, {"role": "assistant", "content": "x"},
                                           {"role": "tool", "content": "42"}]}, "messages.2.tool_call_id"),
    ("/v1/chat/completions", {"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
    ("/v1/chat/completions", {"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ("/v1/completions", {"n": 10**18}, "n"),            # refused before anything is made per choice
    ("/v1/chat/completions", {"n": 10**18}, "n"),
])
def test_refused_with_a_400_naming_the_field(http, model_name, path, extra, param):
    body = {"model": model_name, **({"prompt": "hi"} if path == "/v1/completions" else {"messages": [USER]}), **extra}
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param and param.split(".")[0] in response.json()["error"]["message"]


def test_unknown_fields_are_ignored_and_named(http, model_name, caplog):
    body = {"model": model_name, "messages": [{**USER, "reasoning": "x"}], "max_tokens": 2, "frobnicate": 1,
            "stream_options": None, "chat_template_kwargs": {"enable_thinking": False},
            "documents": [{"title": "t", "text": "d"}]}
    with caplog.at_level(logging.WARNING, logger="mindmotor.coordinator"):
        response = http.post("/v1/chat/completions", json=body, headers={"X-Request-Id": "ignored-fields-1"})
    assert response.status_code == 200, response.text
    named = response.headers["x-mindmotor-ignored-fields"].split(", ")
    # the tiny model's ChatML template reads neither enable_thinking nor documents: they change nothing
    assert set(named) == {"frobnicate", "messages.0.reasoning", "chat_template_kwargs.enable_thinking", "documents"}
    assert any(getattr(r, "ignored_fields", None) and "frobnicate" in r.ignored_fields for r in caplog.records)
    clean = http.post("/v1/completions", json={"model": model_name, "prompt": "hi", "max_tokens": 1})
    assert "x-mindmotor-ignored-fields" not in clean.headers
    assert "junk" in http.post("/tokenize", json={"model": model_name, "prompt": "hi", "junk": 1}
                               ).headers["x-mindmotor-ignored-fields"]


# -- the template and tokenizer options on a real tokenizer that uses them ------------------------

THINKING = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% for d in documents or [] %}[doc {{ d['title'] }}: {{ d['text'] }}]\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n"
            "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}")


@pytest.fixture(scope="module")
def tokenizer(tiny_ckpt):
    tok = Tokenizer.from_dir(tiny_ckpt)
    tok.chat_template, tok._template = THINKING, None
    return tok


def test_chat_template_kwargs_and_documents_reach_the_template(tokenizer):
    messages = [ChatMessage(role="user", content="hi")]
    off = asyncio.run(chat_text(messages, tokenizer, TemplateOptions(kwargs={"enable_thinking": False})))
    on = asyncio.run(chat_text(messages, tokenizer, TemplateOptions(kwargs={"enable_thinking": True})))
    assert off.endswith("assistant\n<think></think>") and on.endswith("assistant\n")
    docs = TemplateOptions(documents=[{"title": "T", "text": "D"}], kwargs={"other": 1})
    assert "[doc T: D]" in asyncio.run(chat_text(messages, tokenizer, docs))
    assert docs.unused(tokenizer) == ["chat_template_kwargs.other"]


def test_add_special_tokens_uses_the_post_processor(tokenizer):
    bos = tokenizer.hf.token_to_id("<|endoftext|>")
    tokenizer.hf.post_processor = TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)])
    with_bos = asyncio.run(completion_prompts("hi", tokenizer, add_special_tokens=True))[0].token_ids
    without = asyncio.run(completion_prompts("hi", tokenizer, add_special_tokens=False))[0].token_ids
    assert with_bos == [bos, *without]


def test_continue_final_message_needs_the_message_in_the_prompt(tokenizer):
    messages = [ChatMessage(role="user", content="hi"), ChatMessage(role="assistant", content="")]
    with pytest.raises(BadRequest):
        asyncio.run(chat_text(messages, tokenizer, TemplateOptions(add_generation_prompt=False,
                                                                  continue_final_message=True)))
