"""The `Trainer` gRPC service (grpc.aio) with the standard health service, and its Prometheus
endpoint on a side port.

    mindmotor trainer --port 50070 --store checkpoints/ --metrics-port 9470

Thin handlers: validation and processes live in `jobs.py`, versions in `store.py`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from mindmotor.common import rpc
from mindmotor.common.https_side import serve_metrics
from mindmotor.common.lifecycle import stop_requested
from mindmotor.vocabulary import JobState
from mindmotor.model.config import CheckpointError
from mindmotor.protocol import trainer_pb2, trainer_pb2_grpc

from .config import ConfigError
from .jobs import JobManager, TrainingJob
from .store import CheckpointStore, CheckpointVersion

log = logging.getLogger("mindmotor.trainer.service")

SERVICE_NAME = "mindmotor.v1.Trainer"


def job_state(state: JobState) -> int:
    return trainer_pb2.JobState.Value(f"JOB_STATE_{state}")


def job_message(job: TrainingJob) -> trainer_pb2.Job:
    p = job.progress
    return trainer_pb2.Job(
        job_id=job.job_id, state=job_state(job.state), run_name=job.run_name,
        config_json=json.dumps(job.config.to_dict()), nproc=job.nproc,
        step=p.get("step", 0), total_steps=p.get("total_steps", job.config.steps),
        loss=p.get("loss"), val_loss=p.get("val_loss"), tokens_per_s=p.get("tokens_per_s", 0.0),
        checkpoints=job.checkpoints, error=job.error, created_at=job.created_at,
        finished_at=job.finished_at)


def event_message(job: TrainingJob, event: dict) -> trainer_pb2.JobEvent:
    return trainer_pb2.JobEvent(
        job_id=job.job_id, kind=event["event"], time=event.get("time", 0.0),
        step=event.get("step", event.get("start_step", 0)),
        total_steps=event.get("total_steps", job.config.steps), loss=event.get("loss"),
        lr=event.get("lr", 0.0), tokens_per_s=event.get("tokens_per_s", 0.0),
        val_loss=event.get("val_loss"), val_perplexity=event.get("val_perplexity"),
        version=event.get("version", ""), message=event.get("message", ""),
        state=job_state(job.state))


def checkpoint_message(version: CheckpointVersion, promoted: str) -> trainer_pb2.Checkpoint:
    return trainer_pb2.Checkpoint(
        version=version.version, path=str(version.path), step=version.step,
        val_loss=version.val_loss, parent=version.parent or "", run=version.run or "",
        created_at=version.created_at, promoted=version.version == promoted)


class TrainerServicer(trainer_pb2_grpc.TrainerServicer):
    def __init__(self, jobs: JobManager, store: CheckpointStore):
        self.jobs = jobs
        self.store = store

    async def StartJob(self, request, context):
        try:
            overrides = json.loads(request.config_json) if request.config_json.strip() else {}
            job = await self.jobs.start(request.preset, overrides, nproc=request.nproc,
                                        resume=request.resume, run_name=request.run_name)
        except json.JSONDecodeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"config_json: invalid JSON: {exc}")
        except ConfigError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return job_message(job)

    async def GetJob(self, request, context):
        return job_message(await self._job(request.job_id, context))

    async def ListJobs(self, request, context):
        return trainer_pb2.ListJobsResponse(jobs=[job_message(j) for j in self.jobs.jobs.values()])

    async def WatchJob(self, request, context):
        job = await self._job(request.job_id, context)
        async for event in self.jobs.watch(job.job_id):
            yield event_message(job, event)

    async def CancelJob(self, request, context):
        job = await self._job(request.job_id, context)
        return job_message(await self.jobs.cancel(job.job_id))

    async def ListCheckpoints(self, request, context):
        promoted = self._promoted_name()
        versions = self.store.versions()
        return trainer_pb2.ListCheckpointsResponse(
            checkpoints=[checkpoint_message(v, promoted) for v in versions],
            latest=versions[-1].version if versions else "", promoted=promoted)

    async def PromoteCheckpoint(self, request, context):
        try:
            version = self.store.promote(request.version)
        except CheckpointError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return checkpoint_message(version, version.version)

    async def _job(self, job_id: str, context) -> TrainingJob:
        try:
            return self.jobs.get(job_id)
        except KeyError:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no job {job_id!r}")

    def _promoted_name(self) -> str:
        try:
            found = self.store.promoted()
        except CheckpointError:
            return ""
        return found.version if found else ""


async def serve(port: int, store_root: str | Path, host: str = "127.0.0.1",
                metrics_port: int | None = None, admin_token: str | None = None, allow_open: bool = False) -> None:
    """Run until SIGINT/SIGTERM; then stop accepting, cancel running jobs, exit."""
    store = CheckpointStore(store_root)
    store.root.mkdir(parents=True, exist_ok=True)
    jobs = JobManager(store.root)
    server, port = rpc.make_server(host, port, rpc.TRAINER_POLICY, admin_token=admin_token, allow_open=allow_open)
    trainer_pb2_grpc.add_TrainerServicer_to_server(TrainerServicer(jobs, store), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    if metrics_port:
        serve_metrics(host, metrics_port)
    await server.start()
    for name in ("", SERVICE_NAME):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("trainer listening", extra={"port": port, "store": str(store.root),
                                                    "metrics_port": metrics_port})
    await stop_requested().wait()
    log.info("trainer stopping")
    await health_servicer.enter_graceful_shutdown()
    await jobs.shutdown()          # ends every WatchJob stream with the job's final state
    await server.stop(grace=2.0)
