"""`/v1/responses` with OpenAI's own clients as the oracles: the openai SDK's `responses.create`,
`responses.parse` and `responses.stream` (text, function tools with a round trip through
`previous_response_id`, structured output), the openai-agents SDK's default Runner with a
tool-using agent, stored responses (GET, DELETE, input items), and the refusals."""

from __future__ import annotations

import asyncio
import json
from typing import Literal

import httpx
import openai
import pytest
from pydantic import BaseModel

ANSWER = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
          "required": ["answer"], "additionalProperties": False}
WEATHER = {"type": "function", "name": "get_weather", "description": "the weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                          "required": ["city"], "additionalProperties": False}}
FORCED = {"format": {"type": "json_schema", "name": "answer", "schema": ANSWER, "strict": True}}


class Answer(BaseModel):
    answer: Literal["yes", "no"]


@pytest.fixture(scope="module")
def client(coordinator):
    with openai.OpenAI(base_url=coordinator.base_url, api_key="unused", max_retries=0) as c:
        yield c


def test_text_response_is_stored_retrievable_and_deletable(client, model_name):
    response = client.responses.create(model=model_name, input="Hello there", max_output_tokens=6,
                                       instructions="Be brief.", metadata={"k": "v"})
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 6 and response.usage.total_tokens == response.usage.input_tokens + 6
    assert response.output[0].type == "message" and response.output_text
    assert response.metadata == {"k": "v"} and response.instructions == "Be brief."
    again = client.responses.retrieve(response.id)
    assert again.output_text == response.output_text and again.usage == response.usage
    items = client.responses.input_items.list(response.id)
    assert [i.content[0].text for i in items.data] == ["Hello there"]
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    unstored = client.responses.create(model=model_name, input="x", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_structured_output_completes_and_parses(client, model_name):
    parsed = client.responses.parse(model=model_name, input="Is it raining?", text_format=Answer,
                                    temperature=0, max_output_tokens=40)
    assert parsed.status == "completed"
    assert parsed.output_parsed.answer in ("yes", "no")


def test_function_tool_round_trip_through_previous_response_id(client, model_name):
    first = client.responses.create(model=model_name, input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice="required", parallel_tool_calls=False, temperature=0,
                                    max_output_tokens=60)
    calls = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and calls and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments)["city"] in ("Paris", "Oslo")
    second = client.responses.create(
        model=model_name, previous_response_id=first.id, tools=[WEATHER], text=FORCED, max_output_tokens=40, temperature=0,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}])
    assert second.status == "completed" and json.loads(second.output_text)["answer"] in ("yes", "no")
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens      # it saw the whole conversation


def test_streams_text_and_tool_calls_as_responses_events(client, model_name):
    with client.responses.stream(model=model_name, input="Is it sunny?", text=FORCED, max_output_tokens=40,
                                 temperature=0) as s:
        events = list(s)
        final = s.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text and json.loads(deltas)["answer"] in ("yes", "no")
    assert client.responses.retrieve(final.id).output_text == final.output_text    # stored before completed
    with client.responses.stream(model=model_name, input="Weather in Oslo?", tools=[WEATHER],
                                 tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=40,
                                 temperature=0) as s:
        events = list(s)
        final = s.get_final_response()
    call = final.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == call.arguments
    assert any(e.type == "response.function_call_arguments.done" for e in events)


def test_the_agents_sdk_runner_completes_a_tool_using_agent(coordinator, model_name):
    agents = pytest.importorskip("agents")       # a test extra: pyproject's `test` installs it
    agents.set_tracing_disabled(True)            # no exporter: this machine has no route to OpenAI
    called = []

    @agents.function_tool
    def get_weather(city: Literal["Paris", "Oslo"]) -> str:      # an enum: the random model's call ends
        """The weather in a city."""
        called.append(city)
        return "sunny"

    model = agents.OpenAIResponsesModel(model=model_name, openai_client=openai.AsyncOpenAI(
        base_url=coordinator.base_url, api_key="unused", max_retries=0))
    agent = agents.Agent(name="forecaster", instructions="Is it sunny?", tools=[get_weather], output_type=Answer,
                         model=model, model_settings=agents.ModelSettings(tool_choice="required", max_tokens=80,
                                                                             parallel_tool_calls=False, temperature=0))
    result = asyncio.run(agents.Runner.run(agent, "Is it sunny in Paris?"))
    assert len(called) == 1                        # the call ran; tool_choice is reset to auto after it
    assert result.final_output.answer in ("yes", "no")     # then the structured answer completed the run


@pytest.mark.parametrize("body, param", [
    ({"input": "x", "previous_response_id": "resp_nope"}, "previous_response_id"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "input"),
    ({"input": "x", "background": True}, "background"),
    ({"input": [{"type": "function_call_output", "output": "no call id"}]}, "input"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input"),
    ({"input": []}, "input"),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
])
def test_refusals_name_the_field(coordinator, model_name, body, param):
    response = httpx.post(f"{coordinator.base_url}/responses", json={"model": model_name, **body}, timeout=30)
    assert response.status_code in (400, 404), response.text
    assert response.json()["error"]["param"] == param
