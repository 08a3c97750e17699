"""What helpers do, by task name. Each task takes JSON arguments and returns a JSON result, or
raises `InvalidRequest` for input it refuses; it runs on a thread of `HELPER_STACK_BYTES` in the
helper process (helper.py), so a spec that needs more stack than that crashes the helper — which
costs only the request that sent it."""

from __future__ import annotations

from mindmotor.structured.compile import compile_grammar
from mindmotor.rules.constraint import Constraint


def compile_constraint(kind: str, spec: str, param: str) -> dict:
    """Compile and validate a structured-output spec; its grammar's size on success."""
    grammar = compile_grammar(Constraint(kind, spec, param))
    return {"grammar_chars": len(grammar)}


def crash(how: str) -> dict:
    """For the pool's own tests: die the way a native bug would (`segv`), exit, or hang."""
    import ctypes
    import os
    import time

    if how == "segv":
        ctypes.string_at(0)
    elif how == "exit":
        os._exit(3)
    elif how == "hang":
        time.sleep(3600)
    return {}


TASKS = {"compile_constraint": compile_constraint, "crash": crash}
