"""Tool calling with the unmodified `openai` SDK: tool_choice named and required force a valid call
through the grammar (arguments valid for the function's schema), streamed and not; auto parses
the chat template's <tool_call> format; none leaves text; tool calls and tool results in the
history go through the chat template. Auto and required stream incrementally (content, then per
call its header, then argument deltas) and the SDK's stream helper accumulates them to exactly
the non-streamed response."""

from __future__ import annotations

import json

import openai
import pytest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"enum": ["Paris", "Lima"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0,
                                                                         "maximum": 9},
                                                                   "b": {"type": "boolean"}},
                                  "required": ["a", "b"], "additionalProperties": False}}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(coordinator):
    with openai.OpenAI(base_url=coordinator.base_url, api_key="unused", max_retries=0) as c:
        yield c


def valid(name: str, arguments: str) -> bool:
    args = json.loads(arguments)
    if name == "get_weather":
        return set(args) == {"city", "days"} and args["city"] in ("Paris", "Lima") and 1 <= args["days"] <= 7
    return name == "add" and set(args) == {"a", "b"} and 0 <= args["a"] <= 9 and isinstance(args["b"], bool)


def test_named_tool_choice(client, model_name):
    out = client.chat.completions.create(
        model=model_name, messages=MESSAGES, tools=[WEATHER, ADD], max_tokens=60, seed=2,
        tool_choice={"type": "function", "function": {"name": "add"}})
    (choice,) = out.choices
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "add" and valid("add", call.function.arguments)
    assert call.id and choice.message.content is None and choice.finish_reason == "stop"


def test_named_tool_choice_streams_the_arguments(client, model_name):
    stream = client.chat.completions.create(
        model=model_name, messages=MESSAGES, tools=[WEATHER, ADD], max_tokens=60, seed=2, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    ids, names, pieces, finish = set(), "", [], None
    for chunk in stream:
        for c in chunk.choices:
            for delta in c.delta.tool_calls or []:
                assert delta.index == 0
                ids |= {delta.id} if delta.id else set()
                names += (delta.function.name or "") if delta.function else ""
                if delta.function and delta.function.arguments:
                    pieces.append(delta.function.arguments)
            finish = c.finish_reason or finish
    assert len(ids) == 1 and names == "get_weather" and finish == "stop"
    assert len(pieces) > 1 and valid("get_weather", "".join(pieces))      # streamed in pieces


@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_choice(client, model_name, stream):
    kwargs = dict(model=model_name, messages=MESSAGES, tools=[WEATHER, ADD], tool_choice="required",
                  max_tokens=120, seed=5, n=2)
    if not stream:
        out = client.chat.completions.create(**kwargs)
        results = [(c.message.tool_calls, c.finish_reason) for c in out.choices]
    else:
        calls: dict[int, dict[int, dict]] = {0: {}, 1: {}}
        finish = {}
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            for c in chunk.choices:
                for delta in c.delta.tool_calls or []:
                    entry = calls[c.index].setdefault(delta.index, {"name": "", "arguments": ""})
                    entry["name"] += delta.function.name or ""
                    entry["arguments"] += delta.function.arguments or ""
                if c.finish_reason:
                    finish[c.index] = c.finish_reason
        results = [([type("C", (), {"function": type("F", (), e)}) for e in calls[i].values()], finish[i])
                   for i in (0, 1)]
    for tool_calls, finish_reason in results:
        assert tool_calls and finish_reason == "tool_calls"
        for call in tool_calls:
            assert valid(call.function.name, call.function.arguments)


def test_auto_parses_the_template_format(client, model_name):
    """The output is forced (by a regex) into the template's call format, which auto then parses."""
    regex = r'Sure\.<tool_call>\{"name": "get_weather", "arguments": \{"city": "Lima", "days": [1-7]\}\}</tool_call>'
    out = client.chat.completions.create(model=model_name, messages=MESSAGES, tools=[WEATHER], max_tokens=200,
                                         extra_body={"guided_regex": regex})
    (choice,) = out.choices
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and valid("get_weather", call.function.arguments)
    assert choice.message.content == "Sure." and choice.finish_reason == "tool_calls"
    none = client.chat.completions.create(model=model_name, messages=MESSAGES, tools=[WEATHER], max_tokens=200,
                                          tool_choice="none", extra_body={"guided_regex": regex})
    assert not none.choices[0].message.tool_calls and "<tool_call>" in none.choices[0].message.content


def test_tool_history_goes_through_the_template(client, model_name, coordinator):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    out = client.chat.completions.create(model=model_name, messages=history, tools=[WEATHER], max_tokens=4)
    assert out.choices[0].finish_reason in ("length", "stop")
    tok = coordinator.coordinator.catalog.tokenizer(model_name)
    text = tok.apply_chat_template(
        [{"role": "user", "content": MESSAGES[0]["content"], "tool_calls": None},
         {"role": "assistant", "content": "", "tool_calls": history[1]["tool_calls"]},
         {"role": "tool", "content": "sunny", "tool_calls": None}], tools=[WEATHER])
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}</tool_call>' in text
    assert "<tool_response>sunny</tool_response>" in text and '"get_weather"' in text.split("<|im_start|>user")[0]
    assert out.usage.prompt_tokens == len(tok.encode(text))


STRICT = [{"type": "function", "function": {**t["function"], "strict": True}} for t in (WEATHER, ADD)]
CALL = r'<tool_call>\{"name": "get_weather", "arguments": \{"city": "(Lima|Paris)", "days": [1-7]\}\}</tool_call>'
ADD_CALL = r'<tool_call>\{"arguments": \{"a": [0-9], "b": (true|false)\}, "name": "add"\}</tool_call>'
STREAM_CASES = {
    "auto with a call": dict(extra_body={"guided_regex": r"Sure\. ?" + CALL}, n=2, temperature=1.0),
    "auto without a call": dict(extra_body={"guided_regex": r"No call: [a-z]{2,8} <tool[a-z]{1,4}"}),
    "auto, several calls around text": dict(extra_body={"guided_regex": "Two: " + CALL + r"\n" + ADD_CALL + " done"}),
    "auto, an unknown function is content": dict(extra_body={"guided_regex": r'Hm <tool_call>\{"name": "nope"\}</tool_call>'}),
    "required, n=2": dict(tool_choice="required", n=2, max_tokens=120),
}


def _summary(choices) -> list:
    return [(c.message.content or None, [(t.function.name, t.function.arguments) for t in c.message.tool_calls or []],
             c.finish_reason) for c in choices]


@pytest.mark.parametrize("case", list(STREAM_CASES))
def test_streamed_tool_calls_accumulate_to_the_non_streamed_response(client, model_name, case):
    kwargs = dict(model=model_name, messages=MESSAGES, tools=STRICT, max_tokens=200, seed=11) | STREAM_CASES[case]
    whole = client.chat.completions.create(**kwargs)
    chunks = []
    with client.chat.completions.stream(**kwargs) as stream:
        for event in stream:
            if event.type == "chunk":
                chunks.append(event.chunk)
        streamed = stream.get_final_completion()
    assert _summary(streamed.choices) == _summary(whole.choices)
    made_calls = any(c.message.tool_calls for c in whole.choices)
    assert made_calls == (case not in ("auto without a call", "auto, an unknown function is content"))
    for index, choice in enumerate(whole.choices):
        deltas = [c.choices[0].delta for c in chunks if c.choices and c.choices[0].index == index]
        content = [d.content for d in deltas if d.content]
        assert "".join(content) == (choice.message.content or "")
        if not choice.message.tool_calls:
            continue
        assert all("<" not in piece for piece in content)          # no piece of a marker sent as content
        calls = [t for d in deltas for t in d.tool_calls or []]
        headers = [t for t in calls if t.id]
        assert [(t.index, t.type, t.function.name) for t in headers] == [
            (i, "function", t.function.name) for i, t in enumerate(choice.message.tool_calls)]
        assert len({t.id for t in headers}) == len(headers)
        for i, call in enumerate(choice.message.tool_calls):
            pieces = [t.function.arguments for t in calls if t.index == i and not t.id and t.function.arguments]
            assert "".join(pieces) == call.function.arguments
            # grown, not sent whole -- unless they came before the name (then they follow its header at once)
            assert len(pieces) > 1 or (case, call.function.name) == ("auto, several calls around text", "add")
            assert valid(call.function.name, call.function.arguments)
