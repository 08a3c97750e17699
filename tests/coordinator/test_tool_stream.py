"""The incremental tool-call parser: split anywhere, an output streams to the same content and calls
as when parsed whole; a partial `<tool_call>` marker is never sent as content; headers come before
their arguments."""

from __future__ import annotations

import random

import pytest

from mindmotor.coordinator.openai.tool_stream import ToolCallStream, parse_all

NAMES = {"get_weather", "add"}
AUTO = {
    'Sure.<tool_call>{"name": "get_weather", "arguments": {"city": "Lima", "days": 3}}</tool_call>':
        ("Sure.", [("get_weather", '{"city": "Lima", "days": 3}')]),
    "plain text, no call <tool":
        ("plain text, no call <tool", []),
    'A <tool_call>{"arguments": {"a": 1}, "name": "add"}</tool_call>\n<tool_call>{"name":"add","arguments":{}}'
    '</tool_call> B ': ("A B", [("add", '{"a": 1}'), ("add", "{}")]),
    'x<tool_call>{"name": "nope", "arguments": {}}</tool_call>y':
        ('x<tool_call>{"name": "nope", "arguments": {}}</tool_call>y', []),
    'x<tool_call>{"name": "add"}</tool_call>': ("x", [("add", "{}")]),
    'cut <tool_call>{"name": "add", "arguments": {"a": "s}\\"", "b": [1, {"c": 2}]':
        ("cut", [("add", '{"a": "s}\\"", "b": [1, {"c": 2}]')]),
    "bad <tool_call>not json</tool_call> after": ("bad <tool_call>not json</tool_call> after", []),
}


def streamed(mode: str, text: str, seed: int):
    stream, rng, deltas, at = ToolCallStream(mode, NAMES), random.Random(seed), [], 0
    while at < len(text):
        step = rng.randint(1, 5)
        deltas += stream.feed(text[at:at + step])
        at += step
    return deltas + stream.finish()


@pytest.mark.parametrize("text", list(AUTO))
def test_auto_streams_to_what_the_whole_text_parses_to(text):
    assert parse_all("auto", NAMES, text) == AUTO[text]
    for seed in range(25):
        content, calls = "", []
        for d in streamed("auto", text, seed):
            if d.index is None:
                assert AUTO[text][1] == [] or "<" not in d.content    # no piece of a marker as content
                content += d.content
            elif d.name is not None:
                assert d.index == len(calls)
                calls.append((d.name, ""))
            else:
                assert d.index == len(calls) - 1                      # after its header
                calls[-1] = (calls[-1][0], calls[-1][1] + d.arguments)
        assert (content, calls) == AUTO[text]


def test_required_reads_the_forced_array():
    text = '[{"name":"add","parameters":{"a":3,"b":false}},{"name":"get_weather","parameters":{"city":"Lima","days":1}}]'
    expected = ("", [("add", '{"a":3,"b":false}'), ("get_weather", '{"city":"Lima","days":1}')])
    assert parse_all("required", NAMES, text) == expected
    args = [d.arguments for d in streamed("required", text, 1) if d.index == 0 and d.name is None]
    assert len(args) > 1 and "".join(args) == expected[1][0][1]
    assert parse_all("required", NAMES, '[{"name":"add","parameters":{"a":3,') == ("", [("add", '{"a":3,')])
