"""Traces for the simulator: a CSV of arrival time, prompt length and output length.

Columns: the Azure LLM inference trace's `arrived_at, num_prefill_tokens, num_decode_tokens`
(shipped in the package: `mindmotor.common.bundled_data.AZURE_TRACE`) or `arrival_s, prompt_tokens, output_tokens`.
An optional `session` column names multi-turn conversations: a request's prompt then begins with its
session's previous prompt and answer (`prompt_tokens` counts them; what it adds is new), so that the
prefix cache and the KV host tier see the reuse a chat trace has.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

from mindmotor.common.bundled_data import AZURE_TRACE

COLUMN_SETS = (("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
               ("arrival_s", "prompt_tokens", "output_tokens"))
DEFAULT_TRACE = AZURE_TRACE


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    session: str = ""                   # multi-turn: the previous turn of this session is its prefix


def load_trace(path: str | Path = DEFAULT_TRACE, *, duration_s: float | None = None,
               start_s: float = 0.0, rate: float | None = None, limit: int | None = None
               ) -> list[TraceRequest]:
    """The requests arriving in [start_s, start_s + duration_s) of the trace, re-based to 0.
    `rate`: scale the inter-arrival times so the slice's mean rate is `rate` requests/s.
    ValueError (naming the file and row) for a malformed trace."""
    path = Path(path)
    try:
        fh = open(path, newline="", encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read trace {path}: {exc.strerror or exc}") from exc
    with fh:
        reader = csv.DictReader(fh)
        columns = next((c for c in COLUMN_SETS if set(c) <= set(reader.fieldnames or ())), None)
        if columns is None:
            raise ValueError(f"{path}: expected columns {' / '.join(', '.join(c) for c in COLUMN_SETS)}")
        a, p, o = columns
        rows = []
        for i, row in enumerate(reader, start=2):
            try:
                req = TraceRequest(float(row[a]), int(float(row[p])), int(float(row[o])),
                                   (row.get("session") or "").strip())
            except (TypeError, ValueError):
                raise ValueError(f"{path}:{i}: not a number in {dict(row)}") from None
            if req.prompt_tokens < 1 or req.output_tokens < 1 or req.arrival_s < 0:
                raise ValueError(f"{path}:{i}: lengths must be >= 1 and arrival >= 0")
            rows.append(req)
    rows.sort(key=lambda r: r.arrival_s)
    end = float("inf") if duration_s is None else start_s + duration_s
    rows = [r for r in rows if start_s <= r.arrival_s < end][:limit]
    if not rows:
        raise ValueError(f"{path}: no requests in the chosen slice")
    base = rows[0].arrival_s if start_s == 0.0 else start_s
    rows = [replace(r, arrival_s=r.arrival_s - base) for r in rows]
    if rate is not None:
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        span = rows[-1].arrival_s
        if len(rows) > 1 and span > 0:
            scale = (len(rows) - 1) / rate / span
            rows = [replace(r, arrival_s=r.arrival_s * scale) for r in rows]
    return rows
