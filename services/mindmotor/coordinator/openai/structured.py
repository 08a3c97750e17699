"""A request's structured output, from whichever field asks for it — OpenAI's `response_format`
(`json_object`, `json_schema`), vLLM's `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar` or its newer `structured_outputs` object — as one `Constraint` that names its
field. Compiling it is not done here, on the event loop: `planning.generate` has a helper process
check it (`mindmotor.sandbox.SpecChecker`), so that a bad, huge or crashing spec is a 400 naming
its field before any worker sees it."""

from __future__ import annotations

import json

from mindmotor.rules.constraint import Constraint

from mindmotor.coordinator.http.errors import BadRequest

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
_STRUCTURED_KEYS = {"json": "json", "regex": "regex", "choice": "choice", "grammar": "grammar",
                    "json_object": "json_object"}


def _spec(kind: str, value, param: str) -> str:
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise BadRequest(f"{param} must be a JSON schema (an object or its JSON text)", param=param) from None
        if not isinstance(value, (dict, bool)):
            raise BadRequest(f"{param} must be a JSON schema object", param=param)
        return json.dumps(value)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise BadRequest(f"{param} must be a non-empty list of non-empty strings", param=param)
        return json.dumps(value)
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{param} must be a non-empty string", param=param)
    return value


def _asked(body) -> list[tuple[str, str, str]]:
    """(param, kind, spec) of every structured-output field the request sets."""
    asked = []
    fmt = body.response_format
    if fmt is not None and fmt.get("type") not in (None, "text"):
        kind = fmt.get("type")
        if kind == "json_object":
            asked.append(("response_format", "json_object", ""))
        elif kind == "json_schema":
            js = fmt.get("json_schema")
            if not isinstance(js, dict) or "schema" not in js:
                raise BadRequest("response_format.json_schema must be an object with a schema",
                                 param="response_format.json_schema")
            asked.append(("response_format", "json", _spec("json", js["schema"], "response_format.json_schema.schema")))
        else:
            raise BadRequest(f"response_format type {kind!r} is not supported; use text, json_object or json_schema",
                             param="response_format")
    for field, kind in _GUIDED.items():
        value = getattr(body, field, None)
        if value is not None:
            asked.append((field, kind, _spec(kind, value, field)))
    so = body.structured_outputs
    if so:
        keys = [k for k in _STRUCTURED_KEYS if so.get(k) not in (None, False)]
        unknown = sorted(set(so) - set(_STRUCTURED_KEYS) - {"disable_any_whitespace", "disable_fallback",
                                                              "disable_additional_properties", "whitespace_pattern"})
        if unknown or len(keys) != 1:
            raise BadRequest("structured_outputs must set exactly one of json, regex, choice, grammar, json_object",
                             param="structured_outputs")
        key = keys[0]
        kind = _STRUCTURED_KEYS[key]
        spec = "" if kind == "json_object" else _spec(kind, so[key], f"structured_outputs.{key}")
        asked.append(("structured_outputs", kind, spec))
    return asked


def constraint_from_request(body) -> Constraint | None:
    asked = _asked(body)
    if not asked:
        return None
    if len(asked) > 1:
        names = ", ".join(p for p, _, _ in asked)
        raise BadRequest(f"at most one structured output may be asked for, got {names}", param=asked[1][0])
    param, kind, spec = asked[0]
    return Constraint(kind, spec, param)
