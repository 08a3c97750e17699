"""A helper process: `python -m mindmotor.sandbox.helper`, started by `pool.HelperPool` (through
the exec wrapper that kills it with its parent). Reads request frames on stdin, runs each task on
a thread of `HELPER_STACK_BYTES` (so a deep spec overflows here, not where the serving process
compiles it later, on a stack 8× larger), writes reply frames on the original stdout. Anything the
libraries print goes to stderr (the serving process's log), never into the frames. Memory is
capped (`MINDMOTOR_HELPER_MAX_BYTES`, RLIMIT_AS) so a spec that would need gigabytes fails here.
It says it is ready with an empty frame once its imports are done."""

from __future__ import annotations

import os
import resource
import sys

from mindmotor.rules.request_rules import InvalidRequest
from mindmotor.structured.compile import HELPER_STACK_BYTES
from mindmotor.structured.stack_thread import run_on_stack

from . import wire
from .tasks import TASKS

DEFAULT_MAX_BYTES = 4 << 30


def _frames_out():
    """The original stdout, for frames only; fd 1 then points at stderr."""
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def _limit_memory() -> None:
    limit = int(os.environ.get("MINDMOTOR_HELPER_MAX_BYTES", DEFAULT_MAX_BYTES))
    if limit > 0:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _read_exactly(stream, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _run(request: dict) -> dict:
    task = TASKS.get(request.get("task"))
    if task is None:
        return {"error": {"message": f"unknown helper task {request.get('task')!r}", "param": None,
                          "code": "internal_error"}}
    try:
        return {"ok": run_on_stack(lambda: task(**request.get("args", {})), HELPER_STACK_BYTES, "helper-task")}
    except InvalidRequest as exc:
        return {"error": {"message": exc.message, "param": exc.param, "code": exc.code}}
    except MemoryError:
        return {"error": {"message": "the input needs more memory than a helper may use", "param": None,
                          "code": "too_large"}}
    except Exception as exc:  # noqa: BLE001 - a bug in a task, not the input: said so, helper kept
        return {"failed": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    out = _frames_out()
    _limit_memory()
    stdin = sys.stdin.buffer
    out.write(wire.encode({}))                       # ready
    while True:
        header = _read_exactly(stdin, wire.HEADER.size)
        if header is None:
            return                                   # the pool closed the pipe
        (length,) = wire.HEADER.unpack(header)
        if length > wire.MAX_FRAME:
            sys.exit(2)
        body = _read_exactly(stdin, length)
        if body is None:
            return
        out.write(wire.encode(_run(wire.decode(body))))


if __name__ == "__main__":
    main()
