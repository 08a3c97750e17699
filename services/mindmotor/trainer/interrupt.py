"""Stopping a training run cleanly: Ctrl-C (SIGINT) or SIGTERM during the optimizer steps asks
the run to stop after the step in progress, write a resumable checkpoint of it (as a periodic
one: weights, optimizer, scaler, RNG, step) and exit — `--resume latest` then continues from
that step instead of from the last periodic checkpoint.

    with StopRequest() as stop:
        for step in ...:
            ...
            if stop.requested: ...save...; stop.exit()

A second SIGINT (Ctrl-C twice) stops at once, as before (a checkpoint being written is removed,
`staging.py`); a repeated SIGTERM is ignored — whoever sends it (a `--nproc` parent, the trainer
service, torchrun) follows up with SIGKILL after its own grace period. Outside the `with` block
(reading the corpus, training the tokenizer) signals act as they always did. Handlers can only be
installed from the main thread; elsewhere the block changes nothing.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

log = logging.getLogger("mindmotor.trainer")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    def __init__(self):
        self.signal: int | None = None        # the first stop signal received
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, sig: int, frame) -> None:
        if self.signal is None:
            self.signal = sig
            log.info("stop requested: finishing this step, then writing a checkpoint",
                     extra={"signal": signal.Signals(sig).name})
        elif sig == signal.SIGINT == self.signal:
            raise KeyboardInterrupt

    def exit(self) -> None:
        """Leave the run the way the signal would have without this: KeyboardInterrupt for SIGINT,
        exit status 128 + SIGTERM for SIGTERM."""
        if self.signal == signal.SIGINT:
            raise KeyboardInterrupt
        sys.exit(128 + (self.signal or signal.SIGTERM))
