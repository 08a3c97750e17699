"""Specs that used to crash or stall a serving process (issue 19), shared by the tests."""

from __future__ import annotations

import json


def chained_lark(rules: int) -> str:
    """`rules` Lark rules, each referring to the next: the compiler recurses once per rule."""
    return "\n".join(["start: r0"] + [f'r{i}: "a" r{i + 1}' for i in range(rules)] + [f'r{rules}: "b"'])


def optional_chain(rules: int) -> str:
    """Within the rule limit, yet deep enough to overflow the helper's 8 MiB stack (not the
    engine's 64 MiB one): the case only a helper process can contain."""
    return "\n".join(["start: r0"] + [f'r{i}: ("a" r{i + 1})?' for i in range(rules)] + [f'r{rules}: "b"'])


def ref_chain(depth: int) -> dict:
    """A JSON schema whose `$ref`s chain `depth` definitions through `anyOf`."""
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"type": "null"}]} for i in range(depth)}
    defs[f"d{depth}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def nested_schema(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def large_gbnf(rules: int = 600) -> str:
    """~70 KB of GBNF with character classes and alternatives (the issue's 10–15 s compile)."""
    lines = ["root ::= r0"]
    for i in range(rules):
        nxt = f"r{i + 1}" if i + 1 < rules else '"x"'
        lines.append(f"r{i} ::= " + " | ".join(f'"w{j}{i}" [a-z0-9]{{1,{2 + j}}} {nxt}' for j in range(4)))
    return "\n".join(lines)


def tools(count: int, parameters: dict | None = None) -> list[dict]:
    return [{"type": "function", "function": {"name": f"f{i}", "description": "a tool",
                                              "parameters": parameters or {"type": "object"}}}
            for i in range(count)]


def as_json(schema: dict) -> str:
    return json.dumps(schema)
