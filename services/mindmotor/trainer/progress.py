"""Progress of a training run, told three ways (by the main process only):

- a tqdm bar on stderr with loss, learning rate and tokens/s;
- structured log lines (`mindmotor.common.logging`: JSON lines);
- an optional events file of JSON lines, which the trainer service tails to stream `WatchJob`.

Event kinds: `TrainingEvent` (vocabulary.py): `start`, `step`, `eval`, `checkpoint`, `done`,
`error`. Each line is flushed as it is
written, so a reader never waits for a buffer.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from tqdm import tqdm

from mindmotor.vocabulary import TrainingEvent

log = logging.getLogger("mindmotor.trainer")


class ProgressReporter:
    def __init__(self, events_path: str | Path | None = None, show_bar: bool = True):
        self.events = open(events_path, "a", buffering=1) if events_path else None
        self.show_bar = show_bar
        self.bar: tqdm | None = None

    # ---- events ---------------------------------------------------------------------------
    def start(self, *, total_steps: int, start_step: int, **info) -> None:
        self.emit(TrainingEvent.START, total_steps=total_steps, start_step=start_step, **info)
        log.info("training started", extra={"total_steps": total_steps,
                                                        "start_step": start_step, **info})
        if self.show_bar:
            self.bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step",
                            dynamic_ncols=True)

    def step(self, *, step: int, loss: float, lr: float, tokens_per_s: float,
             grad_norm: float, emit: bool = True) -> None:
        if emit:
            self.emit(TrainingEvent.STEP, step=step, loss=loss, lr=lr, tokens_per_s=tokens_per_s,
                      grad_norm=grad_norm)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}")

    def eval(self, *, step: int, val_loss: float, val_perplexity: float) -> None:
        self.emit(TrainingEvent.EVAL, step=step, val_loss=val_loss, val_perplexity=val_perplexity)
        self.write_line(f"step {step}: val_loss {val_loss:.4f}, perplexity {val_perplexity:.2f}")
        log.info("validation", extra={"step": step, "val_loss": val_loss,
                                                 "val_perplexity": val_perplexity})

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
