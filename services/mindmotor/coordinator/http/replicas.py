"""`mindmotor coordinator --replicas N`: N coordinator processes behind one port, supervised —
the front door `mindmotor up` runs, for a coordinator started on its own (a container, a VM).

This process binds the port and keeps its listening socket; each replica inherits it (`--fd`) and
accepts from it, with a port of its own for probes (`--replica-port`). A replica that dies is
started again after a backoff (`runtime/supervisor.py`, as under `up`: logged, counted); one that
stops answering its `/health` is killed and started again. Meanwhile the others serve, and while
none does a new connection waits in the socket's backlog. The replicas share a resume key (a
stream cut by one resumes on another: resume.py), a stored-responses file (a `previous_response_id`
continues on any) and a Prometheus multiprocess directory (the `/metrics` of any replica is all
of theirs). SIGTERM/SIGINT: the replicas drain together, then the
socket closes. Their logs go to this process's stderr.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

from mindmotor.runtime.backoff import RestartBackoff
from mindmotor.runtime.liveness import LivenessProbe, LivenessSettings
from mindmotor.runtime.stop_signals import StopSignals
from mindmotor.runtime.supervisor import Service, Supervisor
from mindmotor.runtime.supervisor_metrics import SupervisorMetrics

from mindmotor.coordinator.config import READY_PREFIX, CoordinatorSettings
from mindmotor.coordinator.metrics import MULTIPROC_ENV, forget_replica
from mindmotor.coordinator.http.server import bind_socket

log = logging.getLogger("mindmotor.coordinator")

CHECK_S = 0.2
START_TIMEOUT_S = 120.0
DRAIN_S = 40.0
OWN_FLAGS = {"--replicas": 1, "--port": 1, "--fd": 1, "--replica-port": 1, "--coordinator-id": 1}


def replica_argv(argv: list[str]) -> list[str]:
    """The group's own `mindmotor coordinator` arguments minus those each replica gets its own of."""
    out, skip = [], 0
    for arg in argv:
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if name in OWN_FLAGS:
            skip = 0 if "=" in arg else OWN_FLAGS[name]
            continue
        out.append(arg)
    return out


def run_replicas(settings: CoordinatorSettings, argv: list[str], replicas: int) -> int:
    sock = bind_socket(settings.host, settings.port)
    sock.listen(settings.http_backlog)
    port = sock.getsockname()[1]
    state = Path(tempfile.mkdtemp(prefix="mindmotor-coordinators-"))
    (state / "metrics").mkdir()
    env = {MULTIPROC_ENV: str(state / "metrics"),
           "MINDMOTOR_RESUME_KEY": settings.resume_key or secrets.token_urlsafe(32),
           # stored responses (/v1/responses) in one file, so a follow-up may land on any replica
           "MINDMOTOR_RESPONSES_STORE_PATH": settings.responses_store_path or str(state / "responses.db")}
    supervisor = Supervisor(None, RestartBackoff(0.5, 30.0), 10.0, SupervisorMetrics())
    ports: dict[str, int] = {}
    base = replica_argv(argv)

    def service(i: int) -> Service:
        name = f"coordinator-{i}"
        return Service(
            name, lambda: ["coordinator", *base, "--fd", str(sock.fileno()), "--replica-port", str(ports.get(name, 0)),
                           "--coordinator-id", f"{settings.coordinator_id}-{i}"],
            READY_PREFIX, env=env, stop_timeout_s=DRAIN_S, pass_fds=(sock.fileno(),),
            liveness=LivenessProbe(LivenessSettings(), lambda: f"http://{settings.host}:{ports.get(name, 0)}/health"),
            on_ready=lambda s: ports.update({name: int(s.ready["replica_port"])}),
            on_death=lambda s, pid: forget_replica(state / "metrics", pid))

    signals = StopSignals(force=supervisor.kill_all)      # a second Ctrl-C or SIGTERM: at once
    signals.install()
    stop = signals.requested
    try:
        started = supervisor.start_all([service(i) for i in range(replicas)], START_TIMEOUT_S)
        ports.update({s.name: int(s.ready["replica_port"]) for s in started})
        print(f"{READY_PREFIX} port={port} replica_ports={','.join(str(ports[s.name]) for s in started)}",
              file=sys.stdout, flush=True)
        log.info("coordinator replicas serving", extra={"port": port, "replicas": replicas, "replica_ports": ports})
        while not stop.wait(CHECK_S):
            supervisor.check()
        return 0
    except Exception as exc:  # noqa: BLE001 — a replica that never started: say why, exit 1
        log.error("the coordinator replicas did not start", exc_info=True, extra={"error": str(exc)})
        return 1
    finally:
        supervisor.stop([[f"coordinator-{i}" for i in range(replicas)]])
        sock.close()
        shutil.rmtree(state, ignore_errors=True)


def run_from_cli(settings: CoordinatorSettings, replicas: int) -> int:
    """From `mindmotor coordinator ... --replicas N` (N > 1): the arguments as given on the command line."""
    argv = sys.argv[sys.argv.index("coordinator") + 1:] if "coordinator" in sys.argv else []
    os.environ.pop(MULTIPROC_ENV, None)
    return run_replicas(settings, argv, replicas)
