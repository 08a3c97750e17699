"""The grammar compiler: a `Constraint` to llguidance's grammar text, validated. Native code that
can crash on a deep spec and take seconds on a large one, so it runs only in a helper process
(`mindmotor.sandbox`, on a thread of `HELPER_STACK_BYTES`) or on the engine's compile thread,
whose stack (`ENGINE_STACK_BYTES`) is 8× larger: a spec a helper compiled cannot overflow there.
Nothing in a serving process's event loop or engine thread calls it."""

from __future__ import annotations

import json

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

from mindmotor.rules.request_rules import InvalidRequest

from mindmotor.rules.constraint import Constraint, check_limits

HELPER_STACK_BYTES = 8 << 20
ENGINE_STACK_BYTES = 64 << 20


def compile_grammar(constraint: Constraint) -> str:
    """llguidance's grammar of `constraint` (limits checked first); InvalidRequest naming
    `constraint.param` when it is not valid."""
    check_limits(constraint)
    kind, spec, param = constraint.kind, constraint.spec, constraint.param
    try:
        if kind == "json_object":
            grammar = llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}',
                                                                    defaults={"whitespace_flexible": False})
        elif kind == "json":
            grammar = llguidance.LLMatcher.grammar_from_json_schema(spec, defaults={"whitespace_flexible": False})
        elif kind == "regex":
            grammar = llguidance.LLMatcher.grammar_from_regex(spec)
        elif kind == "choice":
            choices = json.loads(spec)
            grammar = llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
        else:
            grammar = llguidance.LLMatcher.grammar_from_lark(any_to_lark(spec))
    except (RecursionError, MemoryError):
        raise InvalidRequest(f"the {kind} constraint is too deeply nested or too large to compile",
                             param=param, code="structured_output_too_complex") from None
    except Exception as exc:  # noqa: BLE001 - every compile failure is the request's
        raise InvalidRequest(f"the {kind} constraint is not valid: {exc}", param=param) from None
    error = llguidance.LLMatcher.validate_grammar(grammar, None)
    if error:
        raise InvalidRequest(f"the {kind} constraint is not valid: {error.strip()}", param=param)
    return grammar
