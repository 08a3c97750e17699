"""Log lines and a progress bar on one terminal: while a tqdm bar is drawn, every console log line
goes through `tqdm.write` (the bar is cleared, the line written, the bar drawn again below it), so
a line never lands in the middle of the bar and the bar is never left behind in the scrollback.

    with bar_safe_logging():
        bar = tqdm(...)
        log.info("validation", ...)       # above the bar, whole

tqdm's own `tqdm.contrib.logging.logging_redirect_tqdm` does the same but copies only a handler's
formatter: the handler's filters — our `RedactFilter`, which masks secrets (common/logging.py) —
would be lost. Here the console handler itself decides (its level, its filters, its formatter);
only the writing goes through tqdm. Handlers that write elsewhere (a file) are left alone.
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from typing import Iterator

from tqdm import tqdm


class BarSafeHandler(logging.Handler):
    """Writes what `console` would write, with `tqdm.write`."""

    def __init__(self, console: logging.StreamHandler):
        super().__init__(console.level)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        if not self.console.filter(record):          # the redaction happens here
            return
        try:
            tqdm.write(self.console.format(record), file=self.console.stream)
        except Exception:  # noqa: BLE001 — logging must never raise into the training loop
            self.handleError(record)


def _console(handler: logging.Handler) -> bool:
    return type(handler) is logging.StreamHandler and handler.stream in (sys.stderr, sys.stdout)


@contextmanager
def bar_safe_logging(logger: logging.Logger | None = None) -> Iterator[None]:
    """While inside: `logger`'s (default: the root's) console handlers write through tqdm."""
    logger = logger or logging.getLogger()
    original = list(logger.handlers)
    logger.handlers = [BarSafeHandler(h) if _console(h) else h for h in original]
    try:
        yield
    finally:
        logger.handlers = original
