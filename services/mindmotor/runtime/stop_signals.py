"""How a supervisor (`mindmotor up`, `coordinator --replicas`) answers SIGINT and SIGTERM, the way
a good daemon does: the first asks for an orderly stop (its children drain, in order), a second one
stops at once — every child SIGKILLed, exit status 128 + the signal (130 for a second Ctrl-C).

    signals = StopSignals(force=supervisor.kill_all)
    signals.install()
    while not signals.requested.wait(1.0): ...
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Callable

log = logging.getLogger("mindmotor.runtime")


class StopSignals:
    def __init__(self, force: Callable[[], None], exit_: Callable[[int], None] = os._exit):
        self.requested = threading.Event()
        self._force = force
        self._exit = exit_              # os._exit: no cleanup left to run once everything is killed

    def install(self, signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> None:
        for signum in signals:
            signal.signal(signum, self.handle)

    def handle(self, signum: int, frame=None) -> None:
        if not self.requested.is_set():
            self.requested.set()
            return
        log.warning("second stop signal: stopping at once", extra={"signal": signal.Signals(signum).name})
        try:
            self._force()
        finally:
            self._exit(128 + signum)
