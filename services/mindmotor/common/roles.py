"""`Role`: what a worker does in its deployment — the one Python form of the proto's `Role` enum.

A `StrEnum`, so a role is also its name wherever text is wanted (command-line flags, Redis
records, JSON, metric labels: "mixed", "prefill", "decode"); `to_proto` / `from_proto` cross the
wire, `parse` reads user input with an error naming the choices.
"""

from __future__ import annotations

import enum

from mindmotor.protocol import roles_pb2


class Role(enum.StrEnum):
    MIXED = "mixed"        # serves whole requests
    PREFILL = "prefill"    # P/D split: prompts and first tokens, KV held for a decode worker
    DECODE = "decode"      # P/D split: continues prefilled requests, pulling their KV

    @classmethod
    def parse(cls, text: str) -> "Role":
        """A role from its name; ValueError naming the choices."""
        try:
            return cls(text)
        except ValueError:
            raise ValueError(f"role must be one of {', '.join(NAMES)}, got {text!r}") from None

    def to_proto(self) -> int:
        return _TO_PROTO[self]

    @classmethod
    def from_proto(cls, value: int, unspecified: "Role | None" = None) -> "Role | None":
        """The role of a proto enum value; `unspecified` for ROLE_UNSPECIFIED (what it means depends
        on the field: "mixed" in a registration, "unchanged" in a heartbeat). ValueError for a value
        this version does not know."""
        if value == roles_pb2.ROLE_UNSPECIFIED:
            return unspecified
        try:
            return _FROM_PROTO[value]
        except KeyError:
            raise ValueError(f"unknown role value {value}") from None


NAMES = tuple(r.value for r in Role)
_TO_PROTO = {Role.MIXED: roles_pb2.ROLE_MIXED, Role.PREFILL: roles_pb2.ROLE_PREFILL,
             Role.DECODE: roles_pb2.ROLE_DECODE}
_FROM_PROTO = {v: k for k, v in _TO_PROTO.items()}
