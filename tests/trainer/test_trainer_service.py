"""The Trainer gRPC service, as a real `mindmotor trainer` process on a free port, running real
training jobs in their own processes."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mindmotor.common.ports import free_ports
from mindmotor.model.manifest import verify_checkpoint
from mindmotor.protocol import trainer_pb2, trainer_pb2_grpc
from mindmotor.trainer.testing import PYTHON, stop_process, tiny_overrides, wait_for

State = trainer_pb2.JobState


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    store = tmp_path_factory.mktemp("service-store")
    port, metrics_port = free_ports(2)
    log_path = store.parent / "trainer-service.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [PYTHON, "-m", "mindmotor.trainer.cli", "trainer", "--host", "127.0.0.1",
             "--port", str(port), "--store", str(store), "--metrics-port", str(metrics_port)],
            stdout=subprocess.DEVNULL, stderr=log, env=dict(os.environ, OMP_NUM_THREADS="1"))
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    health = health_pb2_grpc.HealthStub(channel)

    def serving():
        try:
            reply = health.Check(health_pb2.HealthCheckRequest(service="mindmotor.v1.Trainer"),
                                 timeout=1)
            return reply.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            assert process.poll() is None, log_path.read_text()
            return False

    try:
        wait_for(serving, timeout=30, what="the trainer service to be healthy")
        yield trainer_pb2_grpc.TrainerStub(channel), store, metrics_port
    finally:
        channel.close()
        stop_process(process)


def start(stub, corpus, **overrides) -> trainer_pb2.Job:
    return stub.StartJob(trainer_pb2.StartJobRequest(
        preset="tiny", config_json=json.dumps(tiny_overrides(corpus, **overrides))), timeout=10)


def test_start_watch_to_completion_then_list_checkpoints(service, corpus_dir):
    stub, store, metrics_port = service
    job = start(stub, corpus_dir, steps=6, checkpoint_interval=3, eval_interval=3)
    assert job.state == State.JOB_STATE_RUNNING and job.total_steps == 6
    events = list(stub.WatchJob(trainer_pb2.WatchJobRequest(job_id=job.job_id), timeout=90))
    kinds = [e.kind for e in events]
    assert kinds[0] == "start" and kinds[-2:] == ["done", "state"]
    assert [e.step for e in events if e.kind == "step"] == [1, 2, 3, 4, 5, 6]
    assert all(e.HasField("loss") and e.tokens_per_s > 0 for e in events if e.kind == "step")
    assert [e.step for e in events if e.kind == "eval"] == [3, 6]
    written = [e.version for e in events if e.kind == "checkpoint"]
    assert written == [f"job-{job.job_id}-step000003", f"job-{job.job_id}-step000006"]
    assert events[-1].state == State.JOB_STATE_SUCCEEDED

    finished = stub.GetJob(trainer_pb2.GetJobRequest(job_id=job.job_id), timeout=5)
    assert finished.state == State.JOB_STATE_SUCCEEDED and finished.step == 6
    assert list(finished.checkpoints) == written and finished.HasField("val_loss")

    listing = stub.ListCheckpoints(trainer_pb2.ListCheckpointsRequest(), timeout=5)
    assert written == [c.version for c in listing.checkpoints if c.run == f"job-{job.job_id}"]
    assert listing.latest == written[-1]
    promoted = stub.PromoteCheckpoint(trainer_pb2.PromoteCheckpointRequest(version=written[0]),
                                      timeout=5)
    assert promoted.promoted
    assert stub.ListCheckpoints(trainer_pb2.ListCheckpointsRequest(), timeout=5).promoted == written[0]

    scrape = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    assert f'mindmotor_trainer_step{{job="{job.job_id}"}} 6.0' in scrape
    assert 'mindmotor_trainer_jobs{state="SUCCEEDED"}' in scrape
    assert "mindmotor_trainer_tokens_per_second" in scrape


def test_cancel_keeps_every_finished_checkpoint(service, corpus_dir):
    stub, store, _ = service
    job = start(stub, corpus_dir, steps=100_000, checkpoint_interval=5, eval_interval=5)
    stream = stub.WatchJob(trainer_pb2.WatchJobRequest(job_id=job.job_id), timeout=90)
    for event in stream:
        if event.kind == "checkpoint":
            cancelled = stub.CancelJob(trainer_pb2.CancelJobRequest(job_id=job.job_id), timeout=30)
            break
    assert cancelled.state == State.JOB_STATE_CANCELLED
    rest = list(stream)
    assert rest[-1].kind == "state" and rest[-1].state == State.JOB_STATE_CANCELLED
    ours = sorted(p for p in store.iterdir() if p.name.startswith(f"job-{job.job_id}"))
    # (a version renamed into place just before the signal may not have been reported)
    assert cancelled.checkpoints and set(cancelled.checkpoints) <= {p.name for p in ours}
    for directory in ours:
        verify_checkpoint(directory)
    assert not [p for p in store.iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.parametrize("overrides, message", [
    ({"learning_rate": 0.1}, "unknown config keys ['learning_rate']"),
    ({"hidden_size": 60, "num_attention_heads": 8}, "not a multiple of num_attention_heads"),
    ({"corpus": ["/nonexistent/corpus"]}, "corpus path '/nonexistent/corpus' does not exist"),
    ({"steps": -1}, "steps must be positive"),
])
def test_bad_configs_are_refused_before_any_work(service, corpus_dir, overrides, message):
    stub, store, _ = service
    before = len(stub.ListJobs(trainer_pb2.ListJobsRequest(), timeout=5).jobs)
    request = trainer_pb2.StartJobRequest(
        preset="tiny", config_json=json.dumps({"corpus": [str(corpus_dir)], **overrides}))
    with pytest.raises(grpc.RpcError) as info:
        stub.StartJob(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details()
    assert len(stub.ListJobs(trainer_pb2.ListJobsRequest(), timeout=5).jobs) == before


def test_empty_corpus_bad_json_and_unknown_job(service, tmp_path):
    stub, _, _ = service
    (tmp_path / "empty.txt").write_text("")
    for config_json, message in [(json.dumps({"corpus": [str(tmp_path)]}), "corpus is empty"),
                                 ("{steps: 3", "config_json: invalid JSON")]:
        with pytest.raises(grpc.RpcError) as info:
            stub.StartJob(trainer_pb2.StartJobRequest(preset="tiny", config_json=config_json),
                          timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        stub.GetJob(trainer_pb2.GetJobRequest(job_id="nope"), timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_crashing_job_fails_with_the_reason(service, tmp_path):
    stub, _, _ = service
    (tmp_path / "short.txt").write_text("too short to make two sequences\n")   # valid, but tiny
    job = stub.StartJob(trainer_pb2.StartJobRequest(
        preset="tiny", config_json=json.dumps({"corpus": [str(tmp_path)]})), timeout=10)
    events = list(stub.WatchJob(trainer_pb2.WatchJobRequest(job_id=job.job_id), timeout=60))
    assert events[-1].state == State.JOB_STATE_FAILED
    failed = stub.GetJob(trainer_pb2.GetJobRequest(job_id=job.job_id), timeout=5)
    assert failed.state == State.JOB_STATE_FAILED and "corpus too small" in failed.error
