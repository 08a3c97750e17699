"""The platform's vocabulary: every state, phase, reason and kind a service names, defined once.

Each is a `StrEnum` (like `common/roles.py`'s `Role`), so a member *is* its wire value: it goes into
protos, JSON, Redis records, log fields and metric labels as the same text it always was, and
compares equal to that text (`InstanceState.READY == "ready"`). The values are part of the
platform's interface — clients, dashboards and alerts (deploy/) and the tests match on them — so a
value never changes; a new one is added.

    from mindmotor.vocabulary import FinishReason, InstanceState

    if record.state == InstanceState.DEAD: ...
    response.finish_reason = FinishReason.LENGTH          # "length" on the wire

| enum              | what it names                                              | who sets it             |
|-------------------|------------------------------------------------------------|-------------------------|
| `InstanceState`   | an instance's health in the controller's registry          | controller/states.py    |
| `WorkerState`     | what a worker says of itself (Status, heartbeats)          | worker/admission.py     |
| `RolloutPhase`    | where a deployment's rollout stands                        | deployer/rollout.py     |
| `ReplicaPhase`    | one replica (worker process or pod) of a deployment        | deployer/backends/      |
| `ServiceState`    | a service `mindmotor up` supervises                        | launcher/supervisor.py  |
| `SequenceStatus`  | one request inside the engine (its phase, then its end)    | engine/scheduler.py     |
| `FinishReason`    | why a request's output ended (the OpenAI `finish_reason`)  | engine, worker, coordinator |
| `FailureKind`     | what a failed worker call means (coordinator/failures.py)  | coordinator             |
| `RefusalReason`   | why a worker refused a call before serving it (a metric label) | worker/service.py   |
| `JobState`        | a training job (the proto's `JobState` without its prefix) | trainer/jobs.py         |
| `TrainingEvent`   | the kind of one training progress event                    | trainer/progress.py     |
| `RatioWish`, `RatioReason` | the P/D ratio policy's wish and its decision's code | controller/pd_ratio.py  |
| `ServiceCondition`, `ServiceReason` | an InferenceService's status conditions | operator/status.py |

Roles (mixed / prefill / decode) are `common/roles.Role`, with their proto conversion.
"""

from __future__ import annotations

import enum


class InstanceState(enum.StrEnum):
    """An instance's health in the controller (the state machine: controller/states.py). Only
    READY is routed to; DEAD is not listed in the routing table."""
    STARTING = "starting"      # registered, no heartbeat yet
    READY = "ready"
    SUSPECT = "suspect"        # heartbeats missed, or a coordinator reported a failure
    DRAINING = "draining"      # the worker reported it, or a drain was commanded
    DEAD = "dead"              # no heartbeat for dead_after; forgotten after forget_after


INSTANCE_STATES_LISTED = frozenset({InstanceState.STARTING, InstanceState.READY, InstanceState.SUSPECT,
                                    InstanceState.DRAINING})      # in the routing table
INSTANCE_STATES_ROUTABLE = frozenset({InstanceState.READY})


class WorkerState(enum.StrEnum):
    """What a worker says of itself: its admission state (worker/admission.py), reported in Status;
    heartbeats carry SERVING or DRAINING only (a FAILED worker heartbeats DRAINING)."""
    SERVING = "serving"
    DRAINING = "draining"      # SIGTERM, a role switch: in-flight requests finish, new ones are refused
    FAILED = "failed"          # the engine died; the worker is going away
    UNREACHABLE = "unreachable"  # never said by a worker: a coordinator's word for one whose Status call failed


HEARTBEAT_STATES = (WorkerState.SERVING, WorkerState.DRAINING)     # what a heartbeat may report


class RolloutPhase(enum.StrEnum):
    """A deployment's rollout (deployer/rollout.py)."""
    STARTING = "starting"          # the new version's replicas are starting, with no traffic
    CANARY = "canary"              # ready: it has its canary share, and is analysed
    PROMOTED = "promoted"          # it took the previous version's traffic
    ROLLED_BACK = "rolled_back"    # by the operator
    FAILED = "failed"              # not ready by the deadline, or the canary analysis failed it


ACTIVE_ROLLOUT_PHASES = (RolloutPhase.STARTING, RolloutPhase.CANARY)   # a deployment has one at most


class ReplicaPhase(enum.StrEnum):
    """One replica of a deployment version, as its backend sees it (deployer/backends/base.py)."""
    STARTING = "starting"      # started, not ready yet
    RUNNING = "running"        # ready (its ready line; a pod's readiness)
    STOPPING = "stopping"      # draining before it exits
    CRASHED = "crashed"        # exited on its own; restarted after a backoff


class ServiceState(enum.StrEnum):
    """A service `mindmotor up` supervises (launcher/supervisor.py)."""
    STARTING = "starting"                  # started, its ready line not seen yet
    RUNNING = "running"
    WAITING = "waiting to restart"         # died; started again after the backoff


class FinishReason(enum.StrEnum):
    """Why a request's output ended. STOP, LENGTH and ABORT travel on the wire (worker.proto's
    `finish_reason`, OpenAI's `finish_reason`); the others are the engine's, the worker's or the
    API's own."""
    STOP = "stop"              # EOS, a stop token id or a stop string
    LENGTH = "length"          # max_tokens or the model's context
    ABORT = "abort"            # stopped by an Abort call or a worker that stops serving: resubmit elsewhere
    ERROR = "error"            # the engine raised while serving it (the request alone fails)
    PREFILLED = "prefilled"    # prefill-only: first token sampled, KV pinned for a decode worker ("" on the wire)
    CANCELLED = "cancelled"    # the worker's metric label: the client went away before it finished
    TOOL_CALLS = "tool_calls"  # the OpenAI API's: the model called a tool (chat completions)


SUCCESSFUL_FINISHES = (FinishReason.STOP, FinishReason.LENGTH, FinishReason.ABORT)   # vLLM's success counter


class SequenceStatus(enum.StrEnum):
    """One request inside the engine: waiting, running, then finished with a `FinishReason` (the
    finished statuses' values are those reasons)."""
    WAITING = "waiting"
    WAITING_FOR_KV = "waiting_for_kv"                # a continuation's blocks reserved, its prompt KV being pulled
    RUNNING = "running"
    FINISHED_STOPPED = FinishReason.STOP.value
    FINISHED_LENGTH = FinishReason.LENGTH.value
    FINISHED_ABORTED = FinishReason.ABORT.value
    PREFILLED = FinishReason.PREFILLED.value         # done here: it continues on a decode worker
    FINISHED_ERROR = FinishReason.ERROR.value

    @property
    def finished(self) -> bool:
        """Whether this engine is done computing the request (a PREFILLED one is: it continues on
        a decode worker, see `continues_elsewhere`)."""
        return not (self is SequenceStatus.WAITING or self is SequenceStatus.WAITING_FOR_KV
                    or self is SequenceStatus.RUNNING)          # by identity: once per token, kept cheap

    @property
    def continues_elsewhere(self) -> bool:
        """The request's stream goes on on another worker (a continuation of it): its text keeps
        what it holds back (a possible stop string, part of a character) for that worker."""
        return self is SequenceStatus.PREFILLED

    @property
    def finish_reason(self) -> FinishReason | None:
        """The reason of a finished status; None while the request is not finished."""
        return FinishReason(self.value) if self.finished else None


class FailureKind(enum.StrEnum):
    """What a failed worker call means (coordinator/failures.py `classify`)."""
    BUSY = "busy"              # at its limit: try another instance, mark nothing
    INSTANCE = "instance"      # the instance failed: mark it, move the request
    REQUEST = "request"        # the request failed there: try another, counts towards the request's limit


class RefusalReason(enum.StrEnum):
    """Why a worker refused a Generate or Prefill call: the `reason` of `mindmotor_requests_refused_total`."""
    BUSY = "busy"                          # at its concurrent-call limit, or its spec helpers are
    INVALID_ARGUMENT = "invalid_argument"  # the request is wrong
    ENGINE_DEAD = "engine_dead"            # its engine has stopped


class HelperOutcome(enum.StrEnum):
    """How a task in a helper process ended (`mindmotor_helper_tasks{outcome}`), and why a helper was
    replaced (`mindmotor_helper_restarts{reason}`: crashed, timeout, cancelled, start_failed)."""
    OK = "ok"
    REFUSED = "refused"        # the input is bad: the task's verdict
    FAILED = "failed"          # no verdict (the base of the kinds below)
    BUSY = "busy"              # no idle helper in time
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    ERROR = "error"            # the task itself failed (a bug, not the input): the helper is kept
    CANCELLED = "cancelled"    # the caller went away while the task ran
    START_FAILED = "start_failed"


class JobState(enum.StrEnum):
    """A training job; `trainer_pb2.JobState` is `JOB_STATE_<value>`."""
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)


class TrainingEvent(enum.StrEnum):
    """The `event` of one line of a training run's progress (trainer/progress.py; JobEvent.kind)."""
    START = "start"
    STEP = "step"
    EVAL = "eval"
    CHECKPOINT = "checkpoint"
    DONE = "done"
    ERROR = "error"
    STATE = "state"            # the job's final state (the trainer service's, after the run)


class RatioWish(enum.StrEnum):
    """Which side the P/D ratio policy wants more instances on (controller/pd_ratio.py)."""
    MORE_PREFILL = "more_prefill"
    MORE_DECODE = "more_decode"


class RatioReason(enum.StrEnum):
    """The code of one P/D ratio decision: the `reason` label of `mindmotor_controller_pd_decisions_total`."""
    BALANCED = "balanced"                  # no side misses its target
    LAST_INSTANCE = "last_instance"        # the donor side has a single instance left
    SUSTAINING = "sustaining"              # the wish has not held for `sustain` yet
    DWELL = "dwell"                        # the last switch was too recent
    TTFT_MISS = "ttft_miss"                # switch: a decode instance becomes prefill
    TPOT_MISS = "tpot_miss"                # switch: a prefill instance becomes decode
    NO_MEASUREMENTS = "no_measurements"    # no latency measured yet


class ServiceCondition(enum.StrEnum):
    """The `type` of one condition in an InferenceService's status (operator/status.py)."""
    READY = "Ready"                        # every replica of the serving version is ready
    PROGRESSING = "Progressing"            # replicas are starting, or old versions draining
    CANARY = "Canary"                      # a canary version runs (and takes its share once ready)
    TRAFFIC_ROUTED = "TrafficRouted"       # the controller holds the weights in `status.traffic`


class ServiceReason(enum.StrEnum):
    """The `reason` of an InferenceService condition (CamelCase, as Kubernetes conditions have)."""
    ALL_REPLICAS_READY = "AllReplicasReady"
    REPLICAS_NOT_READY = "ReplicasNotReady"
    INVALID_SPEC = "InvalidSpec"           # the spec cannot be deployed; the message says why
    APPLY_FAILED = "ApplyFailed"           # the API server refused an object; the message says why
    SCALING = "Scaling"
    DRAINING = "DrainingOldVersions"
    STABLE = "Stable"
    NO_CANARY = "NoCanary"
    CANARY_STARTING = "CanaryStarting"     # its replicas are not all ready: no traffic yet
    CANARY_SERVING = "CanaryServing"       # it takes its percent of the traffic
    PROMOTED = "Promoted"                  # the canary became the serving version
    ROLLED_BACK = "RolledBack"             # the canary was removed; the serving version takes all traffic
    WEIGHTS_AT_CONTROLLER = "WeightsAtController"
    PUSHING = "Pushing"                    # pushed; the routing table does not show them yet
    CONTROLLER_UNREACHABLE = "ControllerUnreachable"
    TRAFFIC_REFUSED = "TrafficRefused"
    NO_CONTROLLER = "NoController"         # the operator runs without --controller: weights are not pushed
