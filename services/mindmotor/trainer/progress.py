"""Progress of a training run, told three ways (by the main process only):

- a tqdm bar on stderr with steps done/total, the time left (mean step time so far), loss,
  learning rate and tokens/s, and once, after a few steps, the run's estimated duration;
- structured log lines (`mindmotor.common.logging`), written above the bar while it is drawn
  (`bar_logging.py`: a log line never breaks the bar);
- an optional events file of JSON lines, which the trainer service tails to stream `WatchJob`.

Event kinds: `TrainingEvent` (vocabulary.py): `start`, `step`, `eval`, `checkpoint`, `done`,
`error`. Each line is flushed as it is
written, so a reader never waits for a buffer.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from tqdm import tqdm

from mindmotor.vocabulary import TrainingEvent

from .bar_logging import bar_safe_logging

log = logging.getLogger("mindmotor.trainer")

ESTIMATE_AFTER_STEPS = 4    # the run's estimated duration is told once this many steps have run


class StepClock:
    """Mean wall time per step of this run (validation and checkpoints included, the first step —
    warm-up — left out once there are others) and the time left to `total_steps` at that pace."""

    def __init__(self, total_steps: int, start_step: int, now: float | None = None):
        self.total_steps, self.start_step = total_steps, start_step
        self.started = time.monotonic() if now is None else now
        self.first_done: float | None = None
        self.last_done: float | None = None
        self.step = start_step
        self.steps_run = 0

    def tick(self, step: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.steps_run += 1
        self.step = step
        if self.first_done is None:
            self.first_done = now
        self.last_done = now

    @property
    def elapsed_s(self) -> float:
        return (self.last_done or self.started) - self.started

    @property
    def mean_step_s(self) -> float:
        if self.steps_run > 1:
            return (self.last_done - self.first_done) / (self.steps_run - 1)
        return self.elapsed_s / max(1, self.steps_run)

    @property
    def eta_s(self) -> float | None:
        if self.steps_run == 0:
            return None
        return self.mean_step_s * max(0, self.total_steps - self.step)


def format_duration(seconds: float | None) -> str:
    """3725 → '1h02m05s', 125 → '2m05s', 7.2 → '7s'."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m{s:02d}s"
    return f"{m}m{s:02d}s" if m else f"{s}s"


class ProgressReporter:
    def __init__(self, events_path: str | Path | None = None, show_bar: bool = True):
        self.events = open(events_path, "a", buffering=1) if events_path else None
        self.show_bar = show_bar
        self.bar: tqdm | None = None
        self.clock: StepClock | None = None
        self._bar_logging = ExitStack()

    # ---- events ---------------------------------------------------------------------------
    def start(self, *, total_steps: int, start_step: int, **info) -> None:
        self.emit(TrainingEvent.START, total_steps=total_steps, start_step=start_step, **info)
        log.info("training started", extra={"total_steps": total_steps,
                                                        "start_step": start_step, **info})
        self.clock = StepClock(total_steps, start_step)
        if self.show_bar:
            self._bar_logging.enter_context(bar_safe_logging())
            # smoothing=0: the bar's remaining time is the mean step time so far × steps left.
            self.bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step",
                            dynamic_ncols=True, smoothing=0)

    def step(self, *, step: int, loss: float, lr: float, tokens_per_s: float,
             grad_norm: float, emit: bool = True) -> None:
        clock = self.clock
        if clock is not None:
            clock.tick(step)
        eta_s = clock.eta_s if clock is not None else None
        if emit:
            self.emit(TrainingEvent.STEP, step=step, loss=loss, lr=lr, tokens_per_s=tokens_per_s,
                      grad_norm=grad_norm, eta_s=eta_s)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}")
        if clock is not None and clock.steps_run == ESTIMATE_AFTER_STEPS and step < clock.total_steps:
            total_s = clock.elapsed_s + eta_s
            self.write_line(f"estimated duration: {format_duration(total_s)} for steps {clock.start_step}-"
                            f"{clock.total_steps} ({clock.mean_step_s:.2f} s/step, evaluation and "
                            f"checkpoints extra); {format_duration(eta_s)} left")
            log.info("estimated duration", extra={"steps": clock.total_steps - clock.start_step,
                                                  "estimated_s": round(total_s, 1),
                                                  "mean_step_s": round(clock.mean_step_s, 4),
                                                  "eta_s": round(eta_s, 1)})

    def eval(self, *, step: int, val_loss: float, val_perplexity: float) -> None:
        self.emit(TrainingEvent.EVAL, step=step, val_loss=val_loss, val_perplexity=val_perplexity)
        total = self.clock.total_steps if self.clock is not None else None
        eta_s = self.clock.eta_s if self.clock is not None else None
        left = f", {format_duration(eta_s)} left" if eta_s is not None else ""
        self.write_line(f"step {step}/{total}: val_loss {val_loss:.4f}, perplexity "
                        f"{val_perplexity:.2f}{left}")
        log.info("validation", extra={"step": step, "total_steps": total, "val_loss": val_loss,
                                      "val_perplexity": val_perplexity,
                                      "eta_s": round(eta_s, 1) if eta_s is not None else None})

    def interrupted(self, *, step: int, total_steps: int, version: str | None) -> None:
        text = (f"stopped at step {step}/{total_steps}: checkpoint {version} written; "
                f"continue with --resume latest")
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, file=sys.stderr, flush=True)
        log.info("training interrupted", extra={"step": step, "total_steps": total_steps,
                                                "version": version})

    def checkpoint(self, *, step: int, version: str, path: str, val_loss: float | None) -> None:
        self.emit(TrainingEvent.CHECKPOINT, step=step, version=version, path=path, val_loss=val_loss)
        log.info("checkpoint written", extra={"step": step, "version": version,
                                                         "path": path})

    def done(self, **info) -> None:
        self.emit(TrainingEvent.DONE, **info)
        log.info("training finished", extra=info)

    def error(self, message: str) -> None:
        self.emit(TrainingEvent.ERROR, message=message)

    # ---- plumbing -------------------------------------------------------------------------
    def emit(self, kind: TrainingEvent, **fields) -> None:
        if self.events is not None:
            self.events.write(json.dumps({"event": kind, "time": time.time(), **fields}) + "\n")

    def write_line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        self._bar_logging.close()
        if self.events is not None:
            self.events.close()
            self.events = None


class SilentReporter(ProgressReporter):
    """What processes other than rank 0 report: nothing."""

    def __init__(self):
        super().__init__(events_path=None, show_bar=False)

    def start(self, **info) -> None:
        pass

    def eval(self, **info) -> None:
        pass

    def checkpoint(self, **info) -> None:
        pass

    def done(self, **info) -> None:
        pass

    def interrupted(self, **info) -> None:
        pass
