"""A request's structured output as one `Constraint`, and the limits every spec must pass before
any compiler sees it — checked in pure Python, in O(size of the spec), the same way by the
coordinator (a 400 naming the field), the worker (INVALID_ARGUMENT) and the offline engine.

Why limits on top of the helper processes that compile specs: a compiler that recurses once per
nesting level runs out of C stack on a deep spec (a 3,000-rule chained Lark grammar or a
2,500-deep `$ref` chain crashed llguidance with SIGSEGV), and its time grows with the size of the
spec (a 70 KB GBNF grammar took seconds). The helpers contain any crash and time out; these
limits turn the common cases into a clear error naming the limit before a process is spent on
them. They are far above what real schemas and grammars need (OpenAI's own structured outputs
allow 5 levels of nesting and 100 properties; its tool limit is 128 functions)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .request_rules import InvalidRequest

KINDS = ("json", "json_object", "regex", "choice", "grammar")

MAX_SCHEMA_CHARS = 256 * 1024      # a JSON schema, as JSON text
MAX_SCHEMA_DEPTH = 64              # nesting of objects/arrays in a JSON schema
MAX_SCHEMA_NODES = 20_000          # objects, arrays and values in a JSON schema
MAX_SCHEMA_REFS = 500              # "$ref"s in a JSON schema (a chain of them nests without depth)
MAX_GRAMMAR_CHARS = 64 * 1024      # an EBNF/Lark/GBNF grammar or a regex
MAX_GRAMMAR_RULES = 2_000          # rule definitions in a grammar (lines defining one)
MAX_CHOICES = 1_000                # guided_choice alternatives
MAX_CHOICE_CHARS = 64 * 1024       # all alternatives together


@dataclass(frozen=True)
class Constraint:
    kind: str          # one of KINDS
    spec: str = ""     # json: the schema (JSON text); regex; choice: a JSON list of strings; grammar: EBNF/Lark
    param: str = field(default="structured_outputs", compare=False)   # the request field it came from


def check_limits(constraint: Constraint) -> None:
    """InvalidRequest (naming `constraint.param` and the limit) unless the spec is within every
    limit above. Cheap: nothing here compiles."""
    kind, spec, param = constraint.kind, constraint.spec, constraint.param
    if kind not in KINDS:
        raise InvalidRequest(f"unknown structured output kind {kind!r}; expected one of {', '.join(KINDS)}",
                             param=param)
    if not isinstance(spec, str):
        raise InvalidRequest(f"the {kind} constraint must be text", param=param)
    if kind == "json":
        _check_schema(spec, param)
    elif kind == "choice":
        _check_choices(spec, param)
    elif kind in ("regex", "grammar"):
        _over(len(spec), MAX_GRAMMAR_CHARS, f"the {kind} has {len(spec)} characters", param, "grammar_too_large")
        if kind == "grammar":
            rules = _grammar_rules(spec)
            _over(rules, MAX_GRAMMAR_RULES, f"the grammar defines {rules} rules", param, "grammar_too_large")


def _over(value: int, limit: int, what: str, param: str, code: str) -> None:
    if value > limit:
        raise InvalidRequest(f"{what}; the limit is {limit}", param=param, code=code)


def _check_schema(spec: str, param: str) -> None:
    _over(len(spec), MAX_SCHEMA_CHARS, f"the JSON schema has {len(spec)} characters", param, "schema_too_large")
    try:
        schema = json.loads(spec)
    except (ValueError, RecursionError):
        raise InvalidRequest("the json constraint is not valid JSON (or nests beyond what JSON parsing allows)",
                             param=param) from None
    depth, nodes, refs = json_shape(schema)
    _over(depth, MAX_SCHEMA_DEPTH, f"the JSON schema nests {depth} levels deep", param, "schema_too_deep")
    _over(nodes, MAX_SCHEMA_NODES, f"the JSON schema has {nodes} nodes", param, "schema_too_large")
    _over(refs, MAX_SCHEMA_REFS, f"the JSON schema has {refs} $ref", param, "schema_too_large")


def json_shape(value) -> tuple[int, int, int]:
    """(depth, nodes, "$ref" keys) of a parsed JSON value, without recursion."""
    depth = nodes = refs = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        nodes += 1
        depth = max(depth, level)
        if isinstance(item, dict):
            refs += "$ref" in item
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, level + 1) for v in item)
    return depth, nodes, refs


def _check_choices(spec: str, param: str) -> None:
    _over(len(spec), MAX_CHOICE_CHARS + 4 * MAX_CHOICES, f"the choices have {len(spec)} characters", param,
          "choice_too_large")
    try:
        choices = json.loads(spec)
    except ValueError:
        choices = None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise InvalidRequest("the choice constraint must be a non-empty list of non-empty strings", param=param)
    _over(len(choices), MAX_CHOICES, f"{len(choices)} choices are given", param, "choice_too_large")


def _grammar_rules(spec: str) -> int:
    """Rule definitions in a Lark (`name:`) or GBNF (`name ::=`) grammar: lines that start with
    a name followed by `:` (which includes `::=`)."""
    count = 0
    for line in spec.splitlines():
        head = line.lstrip()
        name_end = 0
        while name_end < len(head) and (head[name_end].isalnum() or head[name_end] in "_-?!."):
            name_end += 1
        if name_end and head[name_end:].lstrip().startswith(":"):
            count += 1
    return count
