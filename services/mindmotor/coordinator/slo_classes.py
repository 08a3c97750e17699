"""SLO classes: named request classes (interactive / standard / batch by default) with the engine
`priority` each maps to (vLLM's `--scheduling-policy priority`: lower runs first), the share of a
model's `max_requests` a class may hold, and its TTFT / TPOT targets (counted as met or missed per
finished choice). A request's class comes from its API key (`class_by_key`: the key's SHA-256, so
no key is written in the config) or else `default_class`; the `X-MindMotor-Class` header may move a
request to a class that is not more urgent than that (a client demotes itself, never promotes)."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

HEADER = "x-mindmotor-class"
DIGEST = re.compile(r"^[0-9a-f]{64}$")


class SLOClass(BaseModel):
    model_config = ConfigDict(extra="forbid")

    priority: int = Field(0, ge=-(2**20), le=2**20)   # added to the request's own `priority` (default 0)
    max_share: float = Field(1.0, gt=0, le=1)         # of the model's max_requests this class may hold
    max_key_share: float = Field(1.0, gt=0, le=1)     # of the class's limit one API key may hold (fairness)
    ttft_s: float | None = Field(None, gt=0)          # targets: a finished choice meets both or misses
    tpot_s: float | None = Field(None, gt=0)


DEFAULT_CLASSES = {
    "interactive": SLOClass(priority=-10, ttft_s=1.0, tpot_s=0.1),
    "standard": SLOClass(priority=0, ttft_s=5.0, tpot_s=0.2),
    "batch": SLOClass(priority=10, max_share=0.5),
}


def check(classes: dict[str, SLOClass], default_class: str, class_by_key: dict[str, str]) -> None:
    """ValueError naming what is wrong with the class settings."""
    if default_class not in classes:
        raise ValueError(f"default_class {default_class!r} is not one of slo_classes ({', '.join(classes)})")
    for name in classes:
        if not re.fullmatch(r"[a-z][a-z0-9_-]{0,31}", name):
            raise ValueError(f"slo class name {name!r}: lowercase letters, digits, '_' and '-' (at most 32)")
    for digest, name in class_by_key.items():
        if not DIGEST.match(digest):
            raise ValueError("class_by_key: keys are API keys' SHA-256 in hex (printf %s \"$KEY\" | sha256sum), "
                             f"got {digest[:12]!r}...")
        if name not in classes:
            raise ValueError(f"class_by_key: class {name!r} is not one of slo_classes ({', '.join(classes)})")


class ClassError(ValueError):
    """The header names no class, or one more urgent than the caller's."""


def resolve(classes: dict[str, SLOClass], default_class: str, class_by_key: dict[str, str],
            caller: str | None, header: str | None) -> str:
    """The request's class name: its key's class (or the default), or the header's if not more urgent."""
    own = class_by_key.get(caller or "", default_class)
    if not header:
        return own
    wanted = header.strip().lower()
    if wanted not in classes:
        raise ClassError(f"unknown class {header!r} in X-MindMotor-Class; choose one of {', '.join(classes)}")
    if classes[wanted].priority < classes[own].priority:
        raise ClassError(f"class {wanted!r} is more urgent than this caller's class {own!r}: "
                         "X-MindMotor-Class may only choose a class that is not more urgent")
    return wanted
