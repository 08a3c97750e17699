"""The phases of a request's time that the coordinator measures (`mindmotor_request_phase_seconds`)
and `mindmotor analyze latency` reads: they add up to the request's e2e latency at the coordinator."""

from __future__ import annotations

PHASE_METRIC = "mindmotor_request_phase_seconds"
PHASE_LABEL = "phase"
CLASS_LABEL = "class"
PHASES = (
    "coordinator",    # arrival to the last worker call: admission, routing, earlier attempts, a remote prefill
    "worker_queue",   # the worker's Generate start to the engine's first step for it
    "prefill",        # that step to the first token
    "decode",         # the first token to the last
    "network",        # the rest of the worker call: gRPC both ways, the coordinator's own handling
)
