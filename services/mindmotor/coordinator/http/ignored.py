"""The unknown-field policy, vLLM's, on every JSON body: a field this server does not know is
ignored — the request is served as if it were absent — but never silently. Its name (a nested one
as a path: `messages.0.reasoning`, `stream_options.foo`) goes into one WARNING log line with the
request id and into the `X-MindMotor-Ignored-Fields` response header (comma-separated, at most
`MAX_NAMES`), so a client can see that a misspelt or unsupported extension did nothing.

Known fields that would change the output but are not implemented are not ignored: they are a 400
naming them (`openai/unsupported.py`). The request bodies keep unknown fields
(`extra="allow"`) only for this."""

from __future__ import annotations

import logging
from typing import Iterable

from pydantic import BaseModel
from starlette.requests import Request

log = logging.getLogger("mindmotor.coordinator")

HEADER = "X-MindMotor-Ignored-Fields"
MAX_NAMES = 32          # in the header and the log line; a body of thousands of keys stays one line
MAX_NAME_CHARS = 64
_PLAIN = {int, str, float}


def unknown_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """The paths of the fields the model and the models nested in it did not know. Only the fields
    the client gave can hold a nested model it wrote (the others are defaults): not every field of
    the request's class is looked at (issue 26: ~40 of them per request)."""
    found = [f"{prefix}{name}" for name in (model.model_extra or {})]
    for name in model.model_fields_set:
        value = getattr(model, name, None)
        if isinstance(value, (BaseModel, list, tuple)):
            found += _nested(value, f"{prefix}{name}.")
    return found


def _nested(value, prefix: str) -> list[str]:
    if isinstance(value, BaseModel):
        return unknown_fields(value, prefix)
    if isinstance(value, (list, tuple)):
        if set(map(type, value)) <= _PLAIN:          # token ids, texts: at C speed
            return []
        return [n for i, v in enumerate(value) if isinstance(v, BaseModel) for n in unknown_fields(v, f"{prefix}{i}.")]
    return []


def note_ignored(request: Request, names: Iterable[str]) -> None:
    """Record fields ignored by this request: the log line now, the header on the response (the
    request id middleware writes it from the request's state)."""
    names = [n if len(n) <= MAX_NAME_CHARS else n[:MAX_NAME_CHARS] + "..." for n in names]
    if not names:
        return
    state = request.state
    ignored = list(getattr(state, "ignored_fields", None) or [])
    ignored += [n for n in names if n not in ignored]
    state.ignored_fields = ignored
    log.warning("request fields ignored (not known to this server)", extra={"ignored_fields": names[:MAX_NAMES]})


def header_value(names: list[str]) -> str:
    shown = [n.strip() or '""' for n in names[:MAX_NAMES]]       # a header value neither ends in a space nor is empty
    more = len(names) - len(shown)
    value = ", ".join(shown) + (f", ... ({more} more)" if more else "")
    return "".join(c if " " <= c <= "~" else "?" for c in value)     # printable ASCII: any name fits a header
