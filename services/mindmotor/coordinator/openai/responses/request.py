"""A Responses API request, checked, and the chat completions request it becomes.

`input` is text or a list of items — messages (`{"role", "content"}`, content text or parts of
`input_text` / `output_text`), `function_call` items (the model's earlier calls) and
`function_call_output` items (their results) — after the stored conversation of
`previous_response_id`, if any; `instructions` are a system message first (not carried into the
next turn, as OpenAI does). Function `tools` and `tool_choice`, `text.format` (json_object,
json_schema; left out when `tool_choice` forces a call, whose output has no text to format — the
agents SDK sends both) and the sampling fields map to their chat equivalents. What would change the output
but is not implemented — other tool types, images and files, `background`, `conversation`,
stored `prompt` templates — is a 400 naming the field; what changes nothing here (`reasoning` on a
model that does not reason, `include`, `service_tier`, `user`, `truncation`) is accepted."""

from __future__ import annotations

from typing import Any, Literal

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mindmotor.coordinator.http.errors import BadRequest, validation_error
from mindmotor.coordinator.openai.schemas import INT64_MAX, ChatCompletionRequest

MAX_METADATA = 16


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")      # unknown fields: ignored and named (http/ignored.py)

    model: str = ""
    input: str | list[dict] = Field(...)
    instructions: str | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    text: dict | None = None
    previous_response_id: str | None = None
    store: bool = True
    stream: bool = False
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=INT64_MAX)      # vLLM's extra
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    reasoning: dict | None = None
    include: list[str] | None = None
    service_tier: str | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    top_logprobs: int | None = None

    def check(self) -> None:
        if self.background:
            raise unsupported("background", "background responses are not supported")
        for name in ("conversation", "prompt"):
            if getattr(self, name) is not None:
                raise unsupported(name, f"{name} is not supported; send the input (or previous_response_id)")
        if self.top_logprobs:
            raise unsupported("top_logprobs", "logprobs are not supported on responses")
        if self.metadata is not None and len(self.metadata) > MAX_METADATA:
            raise BadRequest(f"metadata holds at most {MAX_METADATA} pairs", param="metadata")


def unsupported(param: str, why: str) -> BadRequest:
    return BadRequest(why, param=param, code="unsupported_parameter")


def parse(body: dict) -> ResponsesRequest:
    try:
        request = ResponsesRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(RequestValidationError(exc.errors())) from None
    request.check()
    return request


def input_items(request: ResponsesRequest) -> list[dict]:
    """The request's own input as a list of items (text is one user message), messages in OpenAI's
    stored form: `type: "message"`, content as parts."""
    if isinstance(request.input, str):
        return [_message("user", request.input)]
    if not request.input:
        raise BadRequest("input must not be empty", param="input")
    items = []
    for item in request.input:
        if isinstance(item, dict) and item.get("type", "message") == "message" and isinstance(item.get("content"), str):
            item = {**_message(item.get("role"), item["content"]), **{k: v for k, v in item.items() if k != "content"},
                    "type": "message"}
        items.append(item)
    return items


def _message(role, text: str) -> dict:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def chat_request(request: ResponsesRequest, items: list[dict]) -> ChatCompletionRequest:
    """The chat completions request for `items` (the whole conversation) and the request's settings."""
    messages = ([{"role": "system", "content": request.instructions}] if request.instructions else [])
    messages += _messages(items)
    body: dict[str, Any] = {"model": request.model, "messages": messages, "stream": request.stream,
                            "max_completion_tokens": request.max_output_tokens, "temperature": request.temperature,
                            "top_p": request.top_p, "seed": request.seed}
    if request.tools:
        body["tools"] = [_tool(t, i) for i, t in enumerate(request.tools)]
    if request.tool_choice is not None:
        body["tool_choice"] = _tool_choice(request.tool_choice)
    if request.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = request.parallel_tool_calls
    response_format = _response_format(request.text)
    forced_call = request.tool_choice == "required" or isinstance(request.tool_choice, dict)
    if response_format is not None and not forced_call:   # a forced call's output has no text to format
        body["response_format"] = response_format
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as exc:
        raise validation_error(RequestValidationError(exc.errors())) from None


def _messages(items: list[dict]) -> list[dict]:
    messages: list[dict] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where} must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise BadRequest(f"{where}.role must be user, system, developer or assistant", param="input")
            messages.append({"role": role, "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", where), "type": "function",
                    "function": {"name": _string(item, "name", where), "arguments": _string(item, "arguments", where)}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)            # parallel calls: one assistant message
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                             "content": output if isinstance(output, str) else _text(output, where)})
        elif kind == "reasoning":
            continue                                       # never produced here; nothing to replay
        else:
            raise unsupported("input", f"{where}: input items of type {kind!r} are not supported")
    return messages


def _string(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise BadRequest(f"{where}.{key} must be a string", param="input")
    return value


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content must be text or a list of parts", param="input")
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append(part["refusal"])
        else:
            raise unsupported("input", f"{where}: content parts of type {kind!r} are not supported (text only)")
    return "".join(parts)


def _tool(tool: dict, index: int) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise unsupported("tools", f"tools[{index}]: only function tools are supported, not {kind!r}")
    if not isinstance(tool.get("name"), str):
        raise BadRequest(f"tools[{index}].name must be a string", param="tools")
    function = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice):
    if isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise unsupported("tool_choice", "tool_choice must be none, auto, required or a function")


def _response_format(text: dict | None) -> dict | None:
    fmt = (text or {}).get("format")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema = {"name": fmt.get("name", "response"), "schema": fmt.get("schema")}
        if fmt.get("strict") is not None:
            schema["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": schema}
    raise unsupported("text.format", f"text.format of type {fmt.get('type')!r} is not supported")
