"""Structured logs: one JSON object per line on stderr, for every service — or, on a terminal, one
line a person reads (`--log-format`/`MINDMOTOR_LOG_FORMAT`: auto (default), json, text).

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

The format: `auto` writes JSON lines unless the stream is a terminal, where it writes text
(`12:04:05.123 INFO  up: the platform is serving  url=http://...`). A service whose stderr goes to a
file or a pipe (every child of `mindmotor up`, containers, CI) keeps JSON. Terminal escape
sequences (colours some libraries put in messages) never reach a JSON line.
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import re
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Iterator

from .redact import redact, redact_value

LOG_FORMATS = ("auto", "json", "text")
LOG_FORMAT_ENV = "MINDMOTOR_LOG_FORMAT"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")      # CSI sequences: colours, cursor moves

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
            "msg": _ANSI.sub("", record.getMessage()),
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


class TextFormatter(logging.Formatter):
    """One line a person reads: time, level, service, message, then the fields as key=value."""

    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created).strftime("%H:%M:%S.%f")[:-3]
        fields = [f"{key}={_text_value(value)}" for key, value in vars(record).items()
                  if key not in _RECORD_ATTRS and not key.startswith("_")]
        request_id = request_id_var.get()
        if request_id is not None:
            fields.insert(0, f"request_id={request_id}")
        line = f"{ts} {record.levelname:<7} {self.service}: {record.getMessage()}"
        if fields:
            line += "  " + " ".join(fields)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        elif record.exc_text:
            line += "\n" + record.exc_text
        return line


def _text_value(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return json.dumps(text, ensure_ascii=False) if (not text or any(c.isspace() for c in text)) else text


def resolve_log_format(log_format: str | None, stream) -> str:
    """`json` or `text`: the given format, else $MINDMOTOR_LOG_FORMAT, else `auto` — text on a
    terminal, JSON elsewhere. ValueError for an unknown name."""
    chosen = (log_format or os.environ.get(LOG_FORMAT_ENV) or "auto").strip().lower()
    if chosen not in LOG_FORMATS:
        raise ValueError(f"log format {chosen!r} is not one of {', '.join(LOG_FORMATS)}")
    if chosen == "auto":
        isatty = getattr(stream, "isatty", None)
        chosen = "text" if isatty is not None and isatty() else "json"
    return chosen


def setup_logging(service_name: str, level: str | int = "INFO", stream=None, log_format: str | None = None) -> None:
    """Send every logger's records to `stream` (stderr by default), as JSON lines or, on a
    terminal, as text (`resolve_log_format`). Replaces the root logger's handlers, so calling it
    twice does not duplicate lines."""
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    formatter = TextFormatter if resolve_log_format(log_format, stream) == "text" else JsonFormatter
    handler.setFormatter(formatter(service_name))
    handler.addFilter(RedactFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
