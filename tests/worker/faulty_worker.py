"""`mindmotor worker` with faults injected into its real engine, for the poison tests. Run as
`python faulty_worker.py worker --model DIR ...` (the arguments of `mindmotor`):

- a request whose id contains `poison` raises in the engine's output processing on its second
  token (as a detokenizer that chokes on what it was given would): the engine must fail that
  request alone and serve on;
- once a request whose id contains `break-engine` was taken, the model's forward pass fails and
  so does the engine's pool check (as when the device and the KV accounting are gone): the engine
  thread dies at its next step, every stream ends, and the worker must stop serving and exit
  non-zero.

Everything else is the real worker: its gRPC server, health service, engine thread and model.
"""

from __future__ import annotations

import sys

from mindmotor.cli import main
from mindmotor.engine.llm_engine import LLMEngine
from mindmotor.engine.model_runner import ModelRunner
from mindmotor.engine.output import OutputProcessor

POISON = "poison"
BREAK_ENGINE = "break-engine"

_on_token = OutputProcessor.on_token
_add_request = LLMEngine.add_request
_check_invariants = LLMEngine.check_invariants
_run = ModelRunner.run
broken = False


def on_token(self, seq, token):
    if POISON in seq.request_id and seq.num_output_tokens >= 1:
        raise RuntimeError("injected fault: this request's tokens cannot be detokenized")
    return _on_token(self, seq, token)


def add_request(self, request_id, *args, **kwargs):
    global broken
    broken = broken or BREAK_ENGINE in request_id
    return _add_request(self, request_id, *args, **kwargs)


def run(self, sched):
    if broken:
        raise RuntimeError("injected fault: the device failed")
    return _run(self, sched)


def check_invariants(self):
    if broken:
        raise AssertionError("injected fault: the KV pool does not add up")
    return _check_invariants(self)


OutputProcessor.on_token = on_token
LLMEngine.add_request = add_request
LLMEngine.check_invariants = check_invariants
ModelRunner.run = run

if __name__ == "__main__":
    sys.exit(main())
