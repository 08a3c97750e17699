"""The official `openai` client, unmodified, against the coordinator: completions and chat, sync,
async and streaming, n > 1, stop strings, usage and include_usage."""

from __future__ import annotations

import asyncio

import openai
import pytest

GREEDY = dict(temperature=0.0, max_tokens=24, extra_body={"ignore_eos": True})


@pytest.fixture
def client(coordinator):
    with openai.OpenAI(base_url=coordinator.base_url, api_key="unused", max_retries=0) as c:
        yield c


def test_models_lists_the_workers_model(client, model_name):
    models = client.models.list().data
    assert [m.id for m in models] == [model_name]
    assert models[0].object == "model" and models[0].owned_by == "mindmotor"
    assert models[0].model_extra["max_model_len"] == 1024


def test_completion_sync_with_usage(client, model_name):
    out = client.completions.create(model=model_name, prompt="The quick brown fox", **GREEDY)
    assert out.object == "text_completion" and out.id.startswith("cmpl-")
    (choice,) = out.choices
    assert choice.finish_reason == "length" and choice.text
    assert out.usage.completion_tokens == 24
    assert out.usage.prompt_tokens > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + 24
    assert out.usage.prompt_tokens_details.cached_tokens >= 0


def test_greedy_is_repeatable_and_token_prompts_match_text_prompts(client, model_name, coordinator):
    first = client.completions.create(model=model_name, prompt="Hello, world!", **GREEDY)
    again = client.completions.create(model=model_name, prompt="Hello, world!", **GREEDY)
    ids = coordinator.coordinator.catalog.tokenizer(model_name).encode("Hello, world!")
    by_ids = client.completions.create(model=model_name, prompt=ids, **GREEDY)
    assert first.choices[0].text == again.choices[0].text == by_ids.choices[0].text


def test_batched_prompts_and_n(client, model_name):
    out = client.completions.create(model=model_name, prompt=["one prompt", "another prompt"], n=3,
                                    max_tokens=5, seed=7, extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == list(range(6))
    assert all(c.finish_reason == "length" for c in out.choices)
    assert out.usage.completion_tokens == 30
    # seeds 7, 8, 9 per prompt: a seeded request repeats exactly
    again = client.completions.create(model=model_name, prompt=["one prompt", "another prompt"], n=3,
                                      max_tokens=5, seed=7, extra_body={"ignore_eos": True})
    assert [c.text for c in out.choices] == [c.text for c in again.choices]


def test_stop_string_cuts_the_text(client, model_name):
    full = client.completions.create(model=model_name, prompt="Stop me somewhere", **GREEDY).choices[0].text
    stop = full[8:11]
    assert stop and stop not in full[:8], "pick another slice for this model's output"
    cut = client.completions.create(model=model_name, prompt="Stop me somewhere", stop=[stop], **GREEDY)
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == full[:full.index(stop)]
    assert cut.choices[0].model_extra["stop_reason"] == stop


def test_completion_stream_with_include_usage(client, model_name):
    expected = client.completions.create(model=model_name, prompt="Stream this", **GREEDY).choices[0].text
    chunks = list(client.completions.create(model=model_name, prompt="Stream this", stream=True,
                                            stream_options={"include_usage": True}, **GREEDY))
    text_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert all(c.object == "text_completion" for c in chunks)
    assert "".join(c.choices[0].text for c in text_chunks) == expected
    assert text_chunks[-1].choices[0].finish_reason == "length"
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == 24


def test_chat_sync(client, model_name):
    out = client.chat.completions.create(model=model_name, messages=[
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi"}], **GREEDY)
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 24


def test_chat_prompt_is_the_chat_template(client, model_name, coordinator):
    messages = [{"role": "user", "content": "Say hi"}]
    tok = coordinator.coordinator.catalog.tokenizer(model_name)
    ids = tok.encode(tok.apply_chat_template(messages))
    chat = client.chat.completions.create(model=model_name, messages=messages, **GREEDY)
    raw = client.completions.create(model=model_name, prompt=ids, **GREEDY)
    assert chat.choices[0].message.content == raw.choices[0].text
    assert chat.usage.prompt_tokens == len(ids)


def test_chat_stream_role_first_then_content_then_usage(client, model_name):
    messages = [{"role": "user", "content": "Stream a reply"}]
    expected = client.chat.completions.create(model=model_name, messages=messages, **GREEDY)
    chunks = list(client.chat.completions.create(model=model_name, messages=messages, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == expected.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == expected.usage.total_tokens


def test_chat_n_and_logprobs(client, model_name):
    out = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "hi"}], n=2,
                                         max_tokens=4, seed=1, logprobs=True, top_logprobs=3,
                                         extra_body={"ignore_eos": True})
    assert len(out.choices) == 2
    for choice in out.choices:
        assert len(choice.logprobs.content) == 4
        entry = choice.logprobs.content[0]
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3 and isinstance(entry.bytes, list)


def test_async_client_streams_concurrently(coordinator, model_name):
    async def run():
        async with openai.AsyncOpenAI(base_url=coordinator.base_url, api_key="unused", max_retries=0) as client:
            async def one(i: int) -> str:
                stream = await client.chat.completions.create(
                    model=model_name, messages=[{"role": "user", "content": f"request {i}"}], stream=True,
                    **GREEDY)
                return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

            streamed = await asyncio.gather(*(one(i) for i in range(4)))
            whole = await asyncio.gather(*(client.chat.completions.create(
                model=model_name, messages=[{"role": "user", "content": f"request {i}"}], **GREEDY)
                for i in range(4)))
            return streamed, [w.choices[0].message.content for w in whole]

    streamed, whole = asyncio.run(run())
    assert streamed == whole
