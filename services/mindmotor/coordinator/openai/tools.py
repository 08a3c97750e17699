"""Tool calling: `tools` and `tool_choice` of a chat request, as a `ToolPlan` — the grammar that
forces a call (named: the function's arguments; required: a JSON array of calls) and the parsing
of the output into OpenAI `tool_calls`. With `auto` the model decides; its calls are parsed in the
chat template's format, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`. Auto and
required outputs are parsed by `tool_stream.ToolCallStream`, streamed or whole alike."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field

from mindmotor.rules.constraint import Constraint

from mindmotor.coordinator.http.errors import BadRequest
from mindmotor.coordinator.openai.tool_stream import ToolCallStream, parse_all


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str                      # JSON text, as OpenAI sends it

    def body(self, index: int | None = None) -> dict:
        out = {"id": f"chatcmpl-tool-{secrets.token_hex(8)}", "type": "function",
               "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            out = {"index": index, **out}
        return out


@dataclass(frozen=True)
class ToolPlan:
    mode: str                           # "none" | "auto" | "required" | "named"
    tools: list[dict] = field(default_factory=list)    # as the request gave them (for the template)
    name: str | None = None             # named: the function
    parallel: bool = True

    @property
    def parses(self) -> bool:
        """Whether the output is parsed for tool calls."""
        return self.mode != "none" and bool(self.tools)

    @property
    def names(self) -> set[str]:
        return {t["function"]["name"] for t in self.tools}

    def stream(self) -> ToolCallStream:
        """The incremental parser of one choice's output (auto and required)."""
        return ToolCallStream(self.mode, self.names)

    def _params(self, name: str) -> dict:
        for tool in self.tools:
            if tool["function"]["name"] == name:
                return tool["function"].get("parameters") or {"type": "object"}
        raise KeyError(name)

    def constraint(self) -> Constraint | None:
        """The grammar that forces the call (named, required); None for auto and none."""
        if self.mode == "named":
            return Constraint("json", json.dumps(self._params(self.name)), "tools")
        if self.mode == "required":
            calls = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                                        "parameters": self._params(t["function"]["name"])},
                      "required": ["name", "parameters"], "additionalProperties": False} for t in self.tools]
            schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
            if not self.parallel:
                schema["maxItems"] = 1
            return Constraint("json", json.dumps(schema), "tools")
        return None

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """(content, calls) of an output. A named call that does not parse (the output was cut at
        max_tokens) leaves the text as content and no calls; auto and required are parsed as they
        stream (a call cut short keeps the arguments it has)."""
        if self.mode == "named":
            try:
                json.loads(text)
            except ValueError:
                return text, []
            return None, [ToolCall(self.name, text)]
        if self.mode in ("auto", "required"):
            content, calls = parse_all(self.mode, self.names, text)
            if calls:
                return content or None, [ToolCall(name, arguments) for name, arguments in calls]
        return text, []


def _check_tools(tools, max_tools: int) -> list[dict]:
    if tools and len(tools) > max_tools:
        raise BadRequest(f"{len(tools)} tools are given; the limit is {max_tools}", param="tools",
                         code="too_many_tools")
    out = []
    for i, tool in enumerate(tools or []):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise BadRequest(f"tools.{i} must be {{\"type\": \"function\", \"function\": {{...}}}}", param=f"tools.{i}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRequest(f"tools.{i}.function.name must be a non-empty string", param=f"tools.{i}.function.name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise BadRequest(f"tools.{i}.function.parameters must be a JSON schema object",
                             param=f"tools.{i}.function.parameters")
        out.append({"type": "function", "function": fn})
    return out


def tool_plan(body, max_tools: int = 128) -> ToolPlan:
    """The request's ToolPlan; BadRequest naming the field for an inconsistent one (or more than
    `max_tools` functions)."""
    tools = _check_tools(body.tools, max_tools)
    choice = body.tool_choice
    parallel = body.parallel_tool_calls is not False
    if choice is None:
        choice = "auto" if tools else "none"
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if not isinstance(name, str):
            raise BadRequest('tool_choice must be "none", "auto", "required" or '
                             '{"type": "function", "function": {"name": ...}}', param="tool_choice")
        if name not in {t["function"]["name"] for t in tools}:
            raise BadRequest(f"tool_choice names function {name!r}, which is not in tools", param="tool_choice")
        return ToolPlan("named", tools, name, parallel)
    if choice not in ("none", "auto", "required"):
        raise BadRequest(f"tool_choice {choice!r} is not one of none, auto, required or a named function",
                         param="tool_choice")
    if choice == "required" and not tools:
        raise BadRequest('tool_choice "required" needs tools', param="tool_choice")
    return ToolPlan(choice, tools, None, parallel)
