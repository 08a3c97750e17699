"""Training jobs for the trainer service: each job is a `mindmotor train` run in its own process
group, writing progress events to a file that the service tails.

    <store>/.jobs/<job_id>/config.json    the complete, validated config
    <store>/.jobs/<job_id>/events.jsonl   progress events (see `progress.py`)
    <store>/.jobs/<job_id>/train.log      the run's stderr (logs, tracebacks)

Cancelling sends SIGTERM to the job's process group (SIGKILL after a grace period). Checkpoints
are renamed into place only when complete, so a cancelled or crashed job leaves every finished
checkpoint intact. No PyTorch in this process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator

from mindmotor.vocabulary import JobState, TrainingEvent

from . import metrics
from .config import TrainConfig
from .validate import validated_config

log = logging.getLogger("mindmotor.trainer.jobs")

POLL_SECONDS = 0.05
CANCEL_GRACE_SECONDS = 5.0


@dataclass
class TrainingJob:
    job_id: str
    run_name: str
    config: TrainConfig
    nproc: int
    directory: Path
    state: JobState = JobState.PENDING
    events: list[dict] = field(default_factory=list)
    checkpoints: list[str] = field(default_factory=list)
    progress: dict = field(default_factory=dict)   # last step / loss / val_loss / tokens_per_s
    error: str = ""
    created_at: float = field(default_factory=time.time)
    finished_at: float = 0.0
    cancel_requested: bool = False
    process: asyncio.subprocess.Process | None = None
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    @property
    def finished(self) -> bool:
        return self.state.terminal


class JobManager:
    def __init__(self, store_root: str | Path):
        self.store_root = Path(store_root)
        self.jobs: dict[str, TrainingJob] = {}
        self._monitors: set[asyncio.Task] = set()

    # ---- the API the service calls ----------------------------------------------------------
    async def start(self, preset: str, overrides: dict, nproc: int = 1, resume: str = "",
                    run_name: str = "") -> TrainingJob:
        """Validate (raising `ConfigError`), then start the job's process."""
        nproc = max(1, nproc)
        config = validated_config(preset, overrides, nproc, self.store_root, resume or None)
        job_id = uuid.uuid4().hex[:12]
        directory = self.store_root / ".jobs" / job_id
        directory.mkdir(parents=True)
        (directory / "config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
        job = TrainingJob(job_id=job_id, run_name=run_name or f"job-{job_id}", config=config,
                          nproc=nproc, directory=directory)
        self.jobs[job_id] = job
        with open(directory / "train.log", "wb") as log_file:
            job.process = await asyncio.create_subprocess_exec(
                *self.command(job, resume), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=log_file, start_new_session=True)
        metrics.JOBS_STARTED.inc()
        await self._set_state(job, JobState.RUNNING)
        log.info("job started", extra={"job": job_id, "pid": job.process.pid})
        task = asyncio.create_task(self._monitor(job))
        self._monitors.add(task)
        task.add_done_callback(self._monitors.discard)
        return job

    def get(self, job_id: str) -> TrainingJob:
        if job_id not in self.jobs:
            raise KeyError(f"no job {job_id!r}")
        return self.jobs[job_id]

    async def watch(self, job_id: str) -> AsyncIterator[dict]:
        """Every event of the job, then live ones, ending with a `state` event once it finished."""
        job = self.get(job_id)
        sent = 0
        while True:
            async with job.changed:
                await job.changed.wait_for(lambda: len(job.events) > sent or job.finished)
                new, finished = job.events[sent:], job.finished
            for event in new:
                yield event
            sent += len(new)
            if finished and sent == len(job.events):
                yield {"event": TrainingEvent.STATE, "time": time.time(), "message": job.error}
                return

    async def cancel(self, job_id: str) -> TrainingJob:
        job = self.get(job_id)
        if job.finished or job.process is None:
            return job
        job.cancel_requested = True
        self._signal(job, signal.SIGTERM)
        try:
            await asyncio.wait_for(self._wait_finished(job), CANCEL_GRACE_SECONDS)
        except asyncio.TimeoutError:
            self._signal(job, signal.SIGKILL)
            await self._wait_finished(job)
        return job

    async def shutdown(self) -> None:
        """Cancel every running job and wait for them to end."""
        await asyncio.gather(*(self.cancel(j.job_id) for j in list(self.jobs.values())
                               if not j.finished))

    # ---- the job's process ------------------------------------------------------------------
    def command(self, job: TrainingJob, resume: str) -> list[str]:
        cmd = [sys.executable, "-m", "mindmotor.trainer.cli", "train",
               "--config", str(job.directory / "config.json"), "--out", str(self.store_root),
               "--run-name", job.run_name, "--nproc", str(job.nproc),
               "--events", str(job.directory / "events.jsonl"), "--no-progress"]
        return cmd + (["--resume", resume] if resume else [])

    async def _monitor(self, job: TrainingJob) -> None:
        """Tail the events file until the process exits; then settle the job's final state."""
        events_path = job.directory / "events.jsonl"
        offset, pending = 0, b""
        exit_task = asyncio.ensure_future(job.process.wait())
        while True:
            await asyncio.wait({exit_task}, timeout=POLL_SECONDS)
            exited = exit_task.done()
            if events_path.is_file():
                with open(events_path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
                offset += len(data)
                *lines, pending = (pending + data).split(b"\n")
                for line in lines:
                    event = _parse_event(line)
                    if event is not None:
                        await self._apply(job, event)
            if exited:
                break
        await self._finish(job)

    async def _apply(self, job: TrainingJob, event: dict) -> None:
        kind = event.get("event")
        if kind == TrainingEvent.STEP:
            job.progress.update(step=event["step"], loss=event["loss"],
                                tokens_per_s=event["tokens_per_s"])
        elif kind == TrainingEvent.START:
            job.progress.update(step=event["start_step"], total_steps=event["total_steps"])
        elif kind == TrainingEvent.EVAL:
            job.progress["val_loss"] = event["val_loss"]
        elif kind == TrainingEvent.CHECKPOINT:
            job.checkpoints.append(event["version"])
        elif kind == TrainingEvent.ERROR:
            job.error = event["message"]
        metrics.record_event(job.job_id, event)
        async with job.changed:
            job.events.append(event)
            job.changed.notify_all()

    async def _finish(self, job: TrainingJob) -> None:
        code = job.process.returncode
        if job.cancel_requested:
            state = JobState.CANCELLED
        elif code == 0:
            state = JobState.SUCCEEDED
        else:
            state = JobState.FAILED
            job.error = job.error or f"exit code {code}: {self._log_tail(job)}"
        job.finished_at = time.time()
        log.info("job ended", extra={"job": job.job_id, "state": state, "code": code})
        await self._set_state(job, state)

    async def _set_state(self, job: TrainingJob, state: JobState) -> None:
        async with job.changed:
            job.state = state
            job.changed.notify_all()
        metrics.record_states([j.state for j in self.jobs.values()])

    async def _wait_finished(self, job: TrainingJob) -> None:
        async with job.changed:
            await job.changed.wait_for(lambda: job.finished)

    def _signal(self, job: TrainingJob, sig: int) -> None:
        try:
            os.killpg(job.process.pid, sig)   # the job's own session: its process and children
        except ProcessLookupError:
            pass

    def _log_tail(self, job: TrainingJob, lines: int = 5) -> str:
        path = job.directory / "train.log"
        if not path.is_file():
            return ""
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])


def _parse_event(line: bytes) -> dict | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None   # a line cut short by a killed process
    return event if isinstance(event, dict) and "event" in event else None
