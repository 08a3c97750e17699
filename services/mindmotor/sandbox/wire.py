"""The helper protocol: one JSON object per frame, a frame a 4-byte big-endian length then the
bytes. Requests `{"task": name, "args": {...}}`, replies `{"ok": result}` or
`{"error": {"message", "param", "code"}}` (the task refused the input). Anything else a helper
does — crash, hang, exit — the pool sees on the pipe."""

from __future__ import annotations

import json
import struct

HEADER = struct.Struct(">I")
MAX_FRAME = 64 << 20


def encode(obj) -> bytes:
    body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()
    return HEADER.pack(len(body)) + body


def decode(body: bytes):
    return json.loads(body)
