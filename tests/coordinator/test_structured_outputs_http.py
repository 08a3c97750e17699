"""Structured outputs over HTTP with the unmodified `openai` SDK: `chat.completions.parse()` with a
pydantic model (nested object, enum, array) returns a valid object; json_schema streamed; vLLM's
guided_choice / guided_regex / structured_outputs in completions; bad constraints are 400s naming
their field."""

from __future__ import annotations

import enum
import json
import re

import httpx
import openai
import pytest
from pydantic import BaseModel, Field


class Color(str, enum.Enum):
    red = "red"
    green = "green"


class Size(BaseModel):
    w: int = Field(ge=0, le=9)


class Item(BaseModel):
    name: str = Field(max_length=5)
    color: Color
    tags: list[str] = Field(max_length=2)
    size: Size


@pytest.fixture(scope="module")
def client(coordinator):
    with openai.OpenAI(base_url=coordinator.base_url, api_key="unused", max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def http(coordinator):
    with httpx.Client(base_url=coordinator.url, timeout=60) as c:
        yield c


def schema_of_item() -> dict:
    """Item's schema with the tags' strings bounded too (a random model rarely closes a string)."""
    schema = Item.model_json_schema()
    schema["properties"]["tags"]["items"]["maxLength"] = 3
    schema["additionalProperties"] = schema["$defs"]["Size"]["additionalProperties"] = False   # strict
    return schema


def test_parse_with_a_pydantic_model(client, model_name):
    for seed in range(3):
        out = client.chat.completions.parse(
            model=model_name, messages=[{"role": "user", "content": "an item please"}], response_format=Item,
            max_tokens=150, seed=seed, temperature=1.0)
        item = out.choices[0].message.parsed
        assert isinstance(item, Item) and isinstance(item.size, Size) and item.color in (Color.red, Color.green)


def test_json_schema_streamed(client, model_name):
    fmt = {"type": "json_schema", "json_schema": {"name": "item", "schema": schema_of_item(), "strict": True}}
    stream = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "x"}],
                                            response_format=fmt, max_tokens=150, seed=1, stream=True, n=2)
    texts = {0: "", 1: ""}
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    for text in texts.values():
        Item.model_validate_json(text)


def test_vllm_fields_in_completions(http, model_name):
    def complete(**extra):
        body = {"model": model_name, "prompt": "pick:", "max_tokens": 40, "temperature": 1.0, "seed": 3, **extra}
        response = http.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"]
    assert complete(guided_choice=["yes", "no way"]) in ("yes", "no way")
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", complete(guided_regex=r"[0-9]{3}-[a-z]{2}"))
    assert re.fullmatch(r"a[bc]{1,4}", complete(structured_outputs={"regex": "a[bc]{1,4}"}))
    assert complete(structured_outputs={"choice": ["one", "two"]}) in ("one", "two")
    assert complete(guided_grammar='root ::= "x" [0-9]') in [f"x{i}" for i in range(10)]
    obj = json.loads(complete(guided_json={"type": "object", "properties": {"ok": {"type": "boolean"}},
                                           "required": ["ok"], "additionalProperties": False}))
    assert set(obj) == {"ok"}


@pytest.mark.parametrize("extra, param", [
    ({"guided_regex": "[a-"}, "guided_regex"),
    ({"guided_json": "{nope"}, "guided_json"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_grammar": "root ::= ("}, "guided_grammar"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
])
def test_bad_constraints_are_400(http, model_name, extra, param):
    response = http.post("/v1/completions", json={"model": model_name, "prompt": "x", **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
