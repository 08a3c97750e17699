"""Structured logs: one JSON object per line on stderr, for every service.

    setup_logging("worker", "INFO")
    with request_context("req-1"):
        log.info("request finished", extra={"finish_reason": "stop"})
    # {"ts": "...", "level": "INFO", "service": "worker", "logger": "...",
    #  "msg": "request finished", "request_id": "req-1", "finish_reason": "stop"}

The request id comes from the `request_id` context variable (set per asyncio task by
`request_context`) or from an explicit `extra={"request_id": ...}`. Any other `extra` field is
written as a JSON field of its own.

Every line is redacted first (`RedactFilter`, on the handler): URL passwords and the secrets the
service registered (`common.redact`) are masked in the message, every `extra` field and the
traceback, so `redis at redis://:PASSWORD@...` is written `redis at redis://:***@...`.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Iterator

from .redact import redact, redact_value

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

# Attributes every LogRecord has; anything else on a record came from `extra`.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


@contextmanager
def request_context(request_id: str) -> Iterator[None]:
    """Tag every log line written inside the block (in this task or thread) with `request_id`."""
    token = request_id_var.set(request_id)
    try:
        yield
    finally:
        request_id_var.reset(token)


class RedactFilter(logging.Filter):
    """Masks secrets in a record before any formatter sees it: the formatted message (its
    arguments merged in), every `extra` field, and the exception text."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact(message)
        if masked != message or record.args:
            record.msg, record.args = masked, None
        for key, value in list(vars(record).items()):
            if key not in _RECORD_ATTRS and not key.startswith("_"):
                setattr(record, key, redact_value(value))
        if record.exc_info:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = request_id_var.get()
        if request_id is not None:
            entry["request_id"] = request_id
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc_info"] = record.exc_text
        return json.dumps(entry, default=str, ensure_ascii=False)


def setup_logging(service_name: str, level: str | int = "INFO", stream=None) -> None:
    """Send every logger's records, as JSON lines, to `stream` (stderr by default).
    Replaces the root logger's handlers, so calling it twice does not duplicate lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(service_name))
    handler.addFilter(RedactFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
