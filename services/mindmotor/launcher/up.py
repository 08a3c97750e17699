"""`mindmotor up`: the production shape on one machine — controller, Deployer and coordinator as
supervised child processes; the workers are the replicas of the Deployer's deployments (one per
`models:` entry), so the Deployer replaces a dead worker (with backoff) and `mindmotor deploy
rollout ...` works against this platform as against any other.

Start: controller → coordinator → deployer (it reads the coordinator's /metrics to judge canaries)
→ the config's deployments applied to it; ready (the line `MINDMOTOR_UP_READY ...` with every port)
when the coordinator's /health sees every worker routable. While it runs, a controller, deployer or
coordinator that dies is started again on the same ports (`runtime.supervisor.Supervisor`:
backoff, counted, logged); one death never stops the platform. One that is alive but does not
answer its liveness probe (SIGSTOPped, stuck: `runtime/liveness.py`) is SIGKILLed and restarted
the same way. Stop (Ctrl-C or SIGTERM): coordinator (finishes its streams) → deployer (its workers
drain) → controller; the services run in process groups of their own, so a terminal's Ctrl-C reaches
`up` alone and the drain happens in that order. A second Ctrl-C (or SIGTERM) stops at once: every
service SIGKILLed, exit status 130 (143). Exit status: 0 stopped, 1 did not start, 2 bad settings,
3 the state directory is held by another `up`.

State: one directory (`state_dir.py`; default `$XDG_DATA_HOME/mindmotor`), locked for this process's
life — the PKI, the deployer's store file (deployments, rollouts, promotions), the ports of the last
run (reused where the config says 0), the logs, and while serving `up.json`, through which
`mindmotor deploy` finds this `up`. A restart on it comes back with the same CA, ports and
deployments. Nothing temporary outlives the process.

Secrets (API keys, the admin token, the Redis URL) reach the services through their environment,
built in one place (`child_env`), never through their command lines. Every gRPC call between them
is mutual TLS: a cluster CA and a certificate per service under <state dir>/pki
(`cluster_pki.child_environments`), each service's files in its environment; `up` itself calls the
deployer with the `admin` certificate, whose paths `up.json` gives `mindmotor deploy`.

A deployer that dies costs no worker: `up` is the child subreaper of everything it starts
(`runtime/subreaper.py`) and the deployer's replicas are started as `up`'s (MINDMOTOR_REPLICA_ANCHOR:
their parent is `up`, they die with `up`), so they go on serving while the deployer is down and the
restarted deployer adopts them from its replica records (deployer/backends/local.py); `up` reaps
the ones that exit meanwhile. Deployments come back from the deployer's store — Redis if
`redis_url` is set, else the state directory's store file — with rollouts since; `up` applies a
config's deployment again only where the deployer lacks it or the config changed it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import secrets
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

import grpc
import httpx

from mindmotor.common import rpc
from mindmotor.common.exposure import open_api_warning
from mindmotor.common.https_side import serve_metrics
from mindmotor.vocabulary import ServiceState
from mindmotor.coordinator.metrics import MULTIPROC_ENV, forget_replica
from mindmotor.deployer.spec import DeploymentSpec
from mindmotor.runtime.backoff import RestartBackoff
from mindmotor.runtime.child_process import ChildProcessError
from mindmotor.runtime.liveness import LivenessProbe
from mindmotor.runtime.stop_signals import StopSignals
from mindmotor.runtime.subreaper import become_subreaper
from mindmotor.runtime.supervisor import Service, Supervisor
from mindmotor.runtime.supervisor_metrics import SupervisorMetrics
from mindmotor.common.up_state import default_state_dir
from mindmotor.runtime.detached_process import proc_start_time

from .cluster_pki import child_environments
from .config import PlatformConfig
from .deployments import deployment_specs
from .state_dir import StateDir, StateDirBusy

log = logging.getLogger("mindmotor.up")

READY_PREFIX = "MINDMOTOR_UP_READY"
CONTROLLER, DEPLOYER, COORDINATOR = "controller", "deployer", "coordinator"
METRICS_DIR = "coordinator-metrics"      # the replicas' shared Prometheus files (multiprocess mode)
CHECK_S = 0.2                 # how often the supervisor looks at its services
ENSURE_EVERY_S = 2.0          # how often the config's deployments are checked to be in the deployer
DEPLOYER_CALL_S = 30.0        # Apply (verifies the checkpoint), Delete
CHECK_CALL_S = 3.0            # Get, from the supervisor's loop
SECRET_VARIABLES = ("MINDMOTOR_API_KEYS", "MINDMOTOR_ADMIN_TOKEN", "MINDMOTOR_REDIS_URL")
BACKLOG = 2048
EXIT_STOPPED, EXIT_NOT_STARTED, EXIT_BAD_CONFIG, EXIT_STATE_BUSY = 0, 1, 2, 3


def serves_lora(config: PlatformConfig) -> bool:
    return any("--enable-lora" in m.extra_args for m in config.models)


def child_env(service: str, config: PlatformConfig) -> dict[str, str | None]:
    """The secrets one service gets, as environment variables (None: removed, so that a variable
    set in `up`'s own environment never reaches a service the config did not give it to). The
    deployer's workers inherit the deployer's environment and read none of these."""
    wanted = {
        CONTROLLER: {"MINDMOTOR_ADMIN_TOKEN": config.admin_token, "MINDMOTOR_REDIS_URL": config.redis_url},
        DEPLOYER: {"MINDMOTOR_ADMIN_TOKEN": config.admin_token, "MINDMOTOR_REDIS_URL": config.redis_url},
        COORDINATOR: {"MINDMOTOR_API_KEYS": ",".join(config.api_keys) or None,
                      "MINDMOTOR_REDIS_URL": config.redis_url,
                      # the LoRA admin endpoints (/v1/load_lora_adapter): only where a model serves adapters
                      "MINDMOTOR_ADMIN_TOKEN": config.admin_token if serves_lora(config) else None},
    }[service]
    return {name: wanted.get(name) for name in SECRET_VARIABLES}


def serve_up_metrics(metrics: SupervisorMetrics, host: str, port: int,
                     files: tuple[str, str] | None = None) -> tuple[object, int]:
    """`up`'s /metrics (its supervisor's counters); over HTTPS with `files` (certificate, key)."""
    return serve_metrics(host, port, metrics.registry, files=files, sec=rpc.RpcSecurity())


def own_settings_removed(environ=None) -> dict[str, None]:
    """`up`'s own settings variables (MINDMOTOR_PORT, MINDMOTOR_MODELS, ...), removed from what its
    services inherit: they configure `up`, which gives each service its settings itself (flags and
    `child_env`), and a service reading them would misread some (`MINDMOTOR_MODELS` is a list here,
    a mapping for a coordinator)."""
    from mindmotor.common.settings_flags import env_name

    names = {env_name(field) for field in PlatformConfig.model_fields}
    nested = tuple(f"{name}__" for name in names)             # MINDMOTOR_PORTS__CONTROLLER, ...
    return {name: None for name in (os.environ if environ is None else environ)
            if name in names or name.startswith(nested)}


def replica_anchor_env(service: str) -> dict[str, str]:
    """The deployer's replicas belong to `up` (it adopts them, they die with it): its pid for the
    deployer's local backend."""
    return {"MINDMOTOR_REPLICA_ANCHOR": str(os.getpid())} if service == DEPLOYER else {}


class Platform:
    def __init__(self, config: PlatformConfig):
        self.config = config
        self.specs: list[DeploymentSpec] = deployment_specs(config)     # ValueError before anything starts
        self.state = StateDir(config.state_dir or default_state_dir())  # OSError: cannot be made
        self.log_dir = Path(config.log_dir).expanduser().resolve() if config.log_dir else self.state.logs
        self.metrics = SupervisorMetrics()
        backoff = RestartBackoff(config.restart_backoff_s, config.restart_backoff_max_s)
        self.supervisor = Supervisor(self.log_dir, backoff, config.stable_after_s, self.metrics)
        self.ports = config.ports.model_copy()
        self.port = config.port
        self.public: socket.socket | None = None         # the API's listening socket, every replica's
        self.replica_ports: dict[str, int] = {}          # coordinator replica → its own port (probes)
        self.resume_key = secrets.token_urlsafe(32)      # the replicas' shared key: a stream resumes on any
        self.metrics_port = 0
        self._metrics_http = None
        self.url = ""
        self._deployments_pending = False
        self.tls_env: dict[str, dict[str, str]] = {}     # service → its TLS files (docs/security.md)
        self._next_ensure = time.monotonic() + ENSURE_EVERY_S

    # ---- the services' command lines (ports fixed after the first start) ----------------------
    @property
    def controller_address(self) -> str:
        return f"{self.config.host}:{self.ports.controller}"

    @property
    def deployer_address(self) -> str:
        return f"{self.config.host}:{self.ports.deployer}"

    def _controller_args(self) -> list[str]:
        cfg = self.config
        return ["controller", "--host", cfg.host, "--port", str(self.ports.controller), "--admin-host", cfg.host,
                "--admin-port", str(self.ports.controller_admin), "--redis-prefix", cfg.redis_prefix,
                *cfg.controller_args]

    def _deployer_args(self) -> list[str]:
        cfg = self.config
        return ["deployer", "--host", cfg.host, "--port", str(self.ports.deployer), "--metrics-port",
                str(self.ports.deployer_metrics), "--controller", self.controller_address, "--worker-host", cfg.host,
                "--redis-prefix", cfg.redis_prefix, "--log-dir", str(self.log_dir / "workers"),
                *([] if cfg.redis_url else ["--store-file", str(self.state.deployer_store)]),
                "--restart-backoff", str(cfg.restart_backoff_s),
                "--restart-backoff-max", str(cfg.restart_backoff_max_s),
                "--coordinator", f"http://{cfg.host}:{self.port}",     # its /metrics judge canaries
                *cfg.deployer_args]

    def _coordinator_args(self, name: str) -> list[str]:
        cfg = self.config
        args = ["coordinator", "--host", cfg.host, "--fd", str(self.public.fileno()),
                "--replica-port", str(self.replica_ports.get(name, 0)), "--coordinator-id", f"up-{name}",
                "--controller", self.controller_address, "--policy", cfg.policy]
        for spec in self.specs:
            directory = spec.versions[0].checkpoint or str(_bundled_model())
            args += ["--model", f"{spec.model}={directory}"]
        if cfg.rate_limit_rpm:
            # per replica; the kernel spreads connections over them, so together they allow about
            # the configured rate (exactly, through Redis, with `redis_url`)
            rpm = cfg.rate_limit_rpm if cfg.redis_url else cfg.rate_limit_rpm / cfg.coordinators
            args += ["--rate-limit-rpm", str(rpm)]
        return args + cfg.coordinator_args

    @property
    def coordinator_names(self) -> list[str]:
        return [f"{COORDINATOR}-{i}" for i in range(self.config.coordinators)]

    @property
    def stop_order(self) -> list[str | list[str]]:
        """Coordinators first, together (they finish their streams), then the deployer (its
        workers drain), then the controller."""
        return [self.coordinator_names, DEPLOYER, CONTROLLER]

    def _service(self, name: str, args, ready_prefix: str, stop_timeout_s: float = 30.0, on_ready=None,
                 role: str | None = None, **extra) -> Service:
        role = role or name
        env = {**own_settings_removed(), **child_env(role, self.config), **replica_anchor_env(role),
               **self.tls_env.get(role, {}),
               **(self._coordinator_env() if role == COORDINATOR else {})}
        return Service(name, args, ready_prefix, env=env, stop_timeout_s=stop_timeout_s,
                       liveness=LivenessProbe(self.config.liveness, self._liveness_url(name),
                                              verify=lambda: self.cluster_ca()),
                       **({"on_ready": on_ready} if on_ready else {}), **extra)

    def _coordinator_service(self, name: str) -> Service:
        return self._service(name, lambda: self._coordinator_args(name), "MINDMOTOR_COORDINATOR_READY",
                             role=COORDINATOR, pass_fds=(self.public.fileno(),),
                             on_ready=lambda service: self.replica_ports.update({name: int(service.ready["replica_port"])}),
                             on_death=lambda service, pid: forget_replica(self.state.run / METRICS_DIR, pid))

    def _coordinator_env(self) -> dict[str, str]:
        return {MULTIPROC_ENV: str(self.state.run / METRICS_DIR), "MINDMOTOR_RESUME_KEY": self.resume_key,
                "MINDMOTOR_RESPONSES_STORE_PATH": str(self.state.responses)}   # /v1/responses: one file, kept

    def _liveness_url(self, service: str):
        """What the service's own server answers (runtime/liveness.py): asked at each probe (ports are
        known once it is ready). A coordinator replica is probed on its own port: the public one
        reaches whichever replica accepts first."""
        host = self.config.host
        if service.startswith(COORDINATOR):
            return lambda: f"http://{host}:{self.replica_ports.get(service, 0)}/health"
        return {CONTROLLER: lambda: f"https://{host}:{self.ports.controller_admin}/health",
                DEPLOYER: lambda: f"https://{host}:{self.ports.deployer_metrics}/metrics"}[service]

    def cluster_ca(self) -> str:
        """The cluster CA's file: the side ports (controller admin, every /metrics) serve HTTPS
        with certificates it signed (common/https_side.py)."""
        return self.tls_env["admin"]["MINDMOTOR_TLS_CA"]

    # ---- start ----------------------------------------------------------------------------
    def start(self) -> None:
        cfg, timeout = self.config, self.config.ready_timeout_s
        become_subreaper()          # before any child: the deployer's replicas are then up's (see above)
        self.tls_env = child_environments(self.state.path)
        self._reuse_ports()
        own = self.tls_env["coordinator"]            # up's /metrics: HTTPS with the coordinator's certificate
        self._metrics_http, self.metrics_port = serve_up_metrics(
            self.metrics, cfg.host, self.ports.metrics, files=(own["MINDMOTOR_TLS_CERT"], own["MINDMOTOR_TLS_KEY"]))
        controller = self.supervisor.start(self._service(CONTROLLER, self._controller_args,
                                                         "MINDMOTOR_CONTROLLER_READY"), timeout)
        self.ports.controller = int(controller.ready["port"])
        self.ports.controller_admin = int(controller.ready["admin_port"])
        self._listen()
        replicas = self.supervisor.start_all([self._coordinator_service(n) for n in self.coordinator_names], timeout)
        for replica in replicas:
            self.replica_ports[replica.name] = int(replica.ready["replica_port"])
        deployer = self.supervisor.start(self._service(DEPLOYER, self._deployer_args, "MINDMOTOR_DEPLOYER_READY",
                                                       stop_timeout_s=_deployer_stop_timeout(cfg.deployer_args),
                                                       on_ready=lambda _: self._deployer_restarted()), timeout)
        self.ports.deployer = int(deployer.ready["port"])
        self.ports.deployer_metrics = int(deployer.ready["metrics_port"])
        self._first_apply()
        self._wait_routable(sum(spec.versions[0].replicas for spec in self.specs))

    def _reuse_ports(self) -> None:
        """The ports of the last run on this state directory wherever the config says 0 (a free
        one), so a restart comes back where it was; one that something else took meanwhile is
        replaced by a free one, with a warning."""
        last, host = self.state.remembered_ports(), self.config.host

        def reuse(what: str, current: int) -> int:
            port = last.get(what)
            if current or not isinstance(port, int) or not port:
                return current
            if _can_bind(host, port):
                return port
            log.warning("a port of the last run is taken now; using another", extra={"service": what, "port": port})
            return 0

        self.port = reuse("port", self.port)
        for name in type(self.ports).model_fields:
            setattr(self.ports, name, reuse(name, getattr(self.ports, name)))
        for name in self.coordinator_names:
            if port := reuse(name, 0):
                self.replica_ports[name] = port

    def remember(self) -> None:
        """Once serving: the ports for the next run, and `up.json` for `mindmotor deploy` & co.
        (common/up_state.py) — endpoints and certificate paths, no secret."""
        ports = {"port": self.port, **self.ports.model_dump(), "metrics": self.metrics_port, **self.replica_ports}
        self.state.remember_ports(ports)
        admin = self.tls_env.get("admin", {})
        self.state.write_up_file({
            "pid": os.getpid(), "pid_start": proc_start_time(os.getpid()), "url": self.url,
            "state_dir": str(self.state.path), "logs": str(self.log_dir), "ports": ports,
            "controller": self.controller_address, "deployer": self.deployer_address,
            "deployments": [spec.name for spec in self.specs], "admin_token": bool(self.config.admin_token),
            "api_keys": bool(self.config.api_keys),
            "tls": {"ca": admin.get("MINDMOTOR_TLS_CA"), "cert": admin.get("MINDMOTOR_TLS_CERT"),
                    "key": admin.get("MINDMOTOR_TLS_KEY")}})

    def _listen(self) -> None:
        """The API's socket, bound and listening here for the platform's life: every coordinator
        replica accepts from it (inherited), so while one restarts the others take its share and
        a new connection waits in the backlog rather than being refused, even with none up."""
        from mindmotor.coordinator.http.server import bind_socket

        metrics_dir = self.state.run / METRICS_DIR
        shutil.rmtree(metrics_dir, ignore_errors=True)          # counters of an earlier run
        metrics_dir.mkdir(parents=True)
        self.public = bind_socket(self.config.host, self.port)
        self.public.listen(BACKLOG)
        self.port = self.public.getsockname()[1]
        self.url = f"http://{self.config.host}:{self.port}"

    def _deployer_client(self, timeout_s: float = DEPLOYER_CALL_S):
        from mindmotor.deployer.client import DeployerClient

        return DeployerClient(self.deployer_address, self.config.admin_token, timeout_s=timeout_s,
                              sec=self.admin_security())

    def admin_security(self):
        from mindmotor.common.rpc import RpcSecurity

        env = self.tls_env["admin"]
        return RpcSecurity.load(env["MINDMOTOR_TLS_CA"], env["MINDMOTOR_TLS_CERT"], env["MINDMOTOR_TLS_KEY"])

    def _missing_deployments(self) -> list[DeploymentSpec]:
        """The config's deployments the deployer does not have (short calls: the supervisor's
        loop waits on them)."""
        with self._deployer_client(CHECK_CALL_S) as client:
            return [spec for spec in self.specs if not _exists(client, spec.name)]

    def _apply_deployments(self, first: bool) -> None:
        """The config's deployments in the deployer: at the first start, created or brought to the
        config (one left by an earlier `up` that cannot be updated is replaced) — unless the
        deployer has it already and the config did not change it since it was last applied from
        this state directory: then it stays as the last run left it (a promoted version stays
        promoted); later, created only where missing (a deployer on a store still has them after
        a restart, with any rollout since)."""
        specs = self.specs if first else self._missing_deployments()
        if not specs:
            return
        applied = self.state.applied_specs()
        with self._deployer_client() as client:
            for spec in specs:
                as_config = json.loads(json.dumps(spec.to_dict()))
                if first and applied.get(spec.name) == as_config and _exists(client, spec.name):
                    log.info("deployment kept as the last run left it (the config did not change it)",
                             extra={"deployment": spec.name})
                    continue
                if not first:
                    log.warning("the deployer does not have a deployment of the config; applying it again",
                                extra={"deployment": spec.name})
                try:
                    client.apply(spec)
                except grpc.RpcError as exc:
                    if not (first and exc.code() == grpc.StatusCode.FAILED_PRECONDITION):
                        raise
                    log.warning("a deployment left by an earlier run differs from the config; replacing it",
                                extra={"deployment": spec.name, "reason": exc.details()})
                    client.delete(spec.name)
                    client.wait_gone(spec.name, self.config.ready_timeout_s)
                    client.apply(spec)
                log.info("deployment applied", extra={"deployment": spec.name, "model": spec.model,
                                                      "replicas": spec.versions[0].replicas, "first_start": first})
                applied[spec.name] = as_config
                self.state.remember_applied(applied)
            if first:
                self._remove_dropped(client, applied)

    def _remove_dropped(self, client, applied: dict) -> None:
        """Deployments an earlier run applied from its config that this config no longer has
        (a `models:` entry removed or renamed): deleted, their workers drained. Deployments made
        with `mindmotor deploy apply` were never in `applied.json` and are left alone."""
        for name in sorted(set(applied) - {spec.name for spec in self.specs}):
            try:
                client.delete(name)
                log.warning("deleted a deployment an earlier run made from a config entry that is gone",
                            extra={"deployment": name})
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.NOT_FOUND:
                    raise
            del applied[name]
            self.state.remember_applied(applied)

    def _first_apply(self) -> None:
        """Apply the config's deployments; a deployer on Redis stands by (UNAVAILABLE) while the
        lease of one that an earlier run left behind is still held: wait for it, within the
        ready timeout."""
        deadline = time.monotonic() + self.config.ready_timeout_s
        while True:
            try:
                return self._apply_deployments(first=True)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                log.info("the deployer stands by (an earlier owner's lease?); waiting",
                         extra={"error": exc.details()})
                time.sleep(0.5)

    def _deployer_restarted(self) -> None:
        self._deployments_pending, self._next_ensure = True, 0.0

    def _ensure_deployments(self) -> None:
        """The config's deployments stay in the deployer: checked every `ENSURE_EVERY_S` and at
        once after a deployer restart, created again where missing (an in-memory deployer that
        restarted, a Redis that came back empty, a `mindmotor deploy delete`). A deployer on Redis
        is a standby until the dead one's lease runs out (UNAVAILABLE): tried again shortly."""
        deployer = self.supervisor.services.get(DEPLOYER)
        if time.monotonic() < self._next_ensure or deployer is None or deployer.state != ServiceState.RUNNING:
            return
        try:
            self._apply_deployments(first=False)
            self._deployments_pending = False
            self._next_ensure = time.monotonic() + ENSURE_EVERY_S
        except grpc.RpcError as exc:
            self._next_ensure = time.monotonic() + 0.5
            log_fn = log.warning if self._deployments_pending else log.info
            log_fn("the deployer did not take the deployments; trying again",
                   extra={"code": exc.code().name, "error": exc.details()})

    def _wait_routable(self, expected: int) -> None:
        """Until every coordinator replica's /health reports every worker routable
        (ChildProcessError if the workers keep crashing or time runs out)."""
        deadline = time.monotonic() + self.config.ready_timeout_s
        last, next_status = None, 0.0
        while time.monotonic() < deadline:
            self.supervisor.check()
            ready = 0
            for name in self.coordinator_names:
                try:
                    r = httpx.get(f"http://{self.config.host}:{self.replica_ports[name]}/health", timeout=2)
                    last = r.json()
                    routable = sum(1 for i in last.get("instances", {}).values() if i.get("routable"))
                    ready += r.status_code == 200 and routable >= expected
                except (httpx.HTTPError, ValueError):
                    pass
            if ready == len(self.coordinator_names):
                return
            if time.monotonic() >= next_status:
                self._fail_on_crash_loop()
                next_status = time.monotonic() + 1.0
            time.sleep(0.1)
        raise ChildProcessError(f"the coordinator did not see {expected} healthy workers in time: {last}")

    def _fail_on_crash_loop(self) -> None:
        with self._deployer_client(CHECK_CALL_S) as client:
            for spec in self.specs:
                try:
                    deployment = client.get(spec.name)
                except grpc.RpcError:
                    continue
                for version in deployment.versions:
                    if version.restarts >= 3:
                        raise ChildProcessError(f"the workers of {spec.name} keep exiting at start "
                                                f"({version.restarts} restarts): {version.last_failure}")

    # ---- run and stop ---------------------------------------------------------------------
    def watch(self, stop: threading.Event) -> None:
        """Until `stop` is set: restart what dies, hand the deployments to a restarted deployer."""
        while not stop.wait(CHECK_S):
            try:
                self.supervisor.check()
                self._ensure_deployments()
            except Exception:  # noqa: BLE001 — the supervisor must outlive anything one pass meets
                log.exception("supervisor pass failed; trying again")

    def stop(self) -> None:
        """Coordinators first (they finish their streams), then the deployer (its workers drain),
        then the controller; the API's socket last (a client connecting meanwhile waits in its
        backlog, then finds it closed)."""
        self.supervisor.stop(self.stop_order)
        if self.public is not None:
            self.public.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()


def _exists(client, name: str) -> bool:
    try:
        client.get(name)
        return True
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return False
        raise


def _can_bind(host: str, port: int) -> bool:
    """Whether a server could listen on host:port now (nothing else listens there)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def _bundled_model() -> Path:
    from mindmotor.model.checkpoint import resolve_model_dir

    return resolve_model_dir(None)


def _deployer_stop_timeout(deployer_args: list[str]) -> float:
    """Long enough for the deployer to drain its workers (its --drain-timeout, default 30 s)."""
    drain = 30.0
    if "--drain-timeout" in deployer_args[:-1]:
        drain = float(deployer_args[deployer_args.index("--drain-timeout") + 1])
    return drain + 15.0


def run(config: PlatformConfig) -> int:
    logging.getLogger("httpx").setLevel(logging.WARNING)   # the readiness polls are not news
    try:
        platform = Platform(config)
    except (ValueError, OSError) as exc:
        log.error("bad platform config", extra={"error": str(exc)})
        return EXIT_BAD_CONFIG
    try:
        platform.state.lock(platform.log_dir)
    except StateDirBusy as exc:
        print(f"mindmotor up: {exc}", file=sys.stderr, flush=True)
        return EXIT_STATE_BUSY
    try:
        return _serve(platform)
    finally:
        platform.state.close()          # up.json and the run's scratch files go, the lock is released


def _serve(platform: Platform) -> int:
    signals = StopSignals(force=platform.supervisor.kill_all)   # a second Ctrl-C or SIGTERM: at once
    signals.install()
    stop = signals.requested
    try:
        platform.start()
    except (ChildProcessError, OSError, ValueError, grpc.RpcError) as exc:
        message = f"{exc.code().name}: {exc.details()}" if isinstance(exc, grpc.RpcError) else str(exc)
        log.error("the platform did not start", extra={"error": message, "logs": str(platform.log_dir)})
        platform.stop()
        return EXIT_NOT_STARTED
    try:
        platform.remember()
        announce(platform)
        if warning := open_api_warning(platform.config.host, bool(platform.config.api_keys)):
            log.warning(warning)
        platform.watch(stop)
        print("stopping MindMotor (draining) ...", flush=True)
    finally:
        platform.stop()
    return EXIT_STOPPED


def announce(platform: Platform) -> None:
    cfg, ports = platform.config, platform.ports
    spec = platform.specs[0]
    auth = ' -H "Authorization: Bearer $KEY"' if cfg.api_keys else ""
    token = "   (with $MINDMOTOR_ADMIN_TOKEN set)" if cfg.admin_token else ""
    workers = sum(s.versions[0].replicas for s in platform.specs)
    print(f"""
MindMotor is up: {platform.url}/v1   ({workers} workers; state in {platform.state.path})

  curl {platform.url}/v1/completions{auth} -H 'Content-Type: application/json' \\
    -d '{{"model": "{spec.model}", "prompt": "def fibonacci(n):", "max_tokens": 48, "temperature": 0}}'

  API + /metrics      {platform.url}   ({cfg.coordinators} coordinator replicas; each alone on its port:
                      {", ".join(f"http://{cfg.host}:{platform.replica_ports[n]}" for n in platform.coordinator_names)})
  controller gRPC     {platform.controller_address}
  controller admin    https://{cfg.host}:{ports.controller_admin}   (/health, /metrics, /v1/instances)
  deployer gRPC       {platform.deployer_address}
                      mindmotor deploy get {spec.name}{token}   (finds this up through its state directory{
                      "" if platform.state.path == default_state_dir() else ": give --state-dir " + str(platform.state.path)})
  deployer /metrics   https://{cfg.host}:{ports.deployer_metrics}/metrics
  up /metrics         https://{cfg.host}:{platform.metrics_port}/metrics
                      (HTTPS with the cluster CA: curl --cacert {platform.cluster_ca()} ...)
  workers             free ports per replica (mindmotor deploy get {spec.name}; the controller's /v1/instances)

Ctrl-C drains and stops everything.
{READY_PREFIX} url={platform.url} port={platform.port} controller_port={ports.controller} \
controller_admin_port={ports.controller_admin} deployer_port={ports.deployer} \
deployer_metrics_port={ports.deployer_metrics} metrics_port={platform.metrics_port} \
coordinator_ports={",".join(str(platform.replica_ports[n]) for n in platform.coordinator_names)} \
logs={platform.log_dir} state_dir={platform.state.path}""",
          flush=True)
