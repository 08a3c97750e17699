"""Prometheus metrics of the trainer service (exposed on `--metrics-port`).

Per job: the last step, training loss, validation loss and tokens/s reported by its events;
overall: how many jobs are in each state, and counters of jobs started and checkpoints written.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from mindmotor.vocabulary import JobState, TrainingEvent


STEP = Gauge("mindmotor_trainer_step", "Optimizer steps completed by a job", ["job"])
LOSS = Gauge("mindmotor_trainer_loss", "Training loss at a job's last step", ["job"])
VAL_LOSS = Gauge("mindmotor_trainer_val_loss", "Validation loss at a job's last evaluation", ["job"])
TOKENS_PER_SECOND = Gauge("mindmotor_trainer_tokens_per_second",
                          "Training throughput at a job's last step", ["job"])
JOBS = Gauge("mindmotor_trainer_jobs", "Training jobs by state", ["state"])
JOBS_STARTED = Counter("mindmotor_trainer_jobs_started", "Training jobs started")
CHECKPOINTS = Counter("mindmotor_trainer_checkpoints", "Checkpoint versions written by jobs")


def record_event(job_id: str, event: dict) -> None:
    kind = event.get("event")
    if kind == TrainingEvent.STEP:
        STEP.labels(job_id).set(event["step"])
        LOSS.labels(job_id).set(event["loss"])
        TOKENS_PER_SECOND.labels(job_id).set(event["tokens_per_s"])
    elif kind == TrainingEvent.EVAL:
        VAL_LOSS.labels(job_id).set(event["val_loss"])
    elif kind == TrainingEvent.CHECKPOINT:
        CHECKPOINTS.inc()


def record_states(states: list[str]) -> None:
    for state in JobState:
        JOBS.labels(state).set(sum(1 for s in states if s == state))
