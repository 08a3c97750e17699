"""The state directory's lock, cleanup and remembered ports, without starting a platform (the whole
restart: tests/e2e/test_up_state.py)."""

from __future__ import annotations

import os
import socket

import pytest

from mindmotor.common.ports import free_ports
from mindmotor.launcher.config import PlatformConfig
from mindmotor.launcher.state_dir import StateDir, StateDirBusy
from mindmotor.launcher.up import Platform


def test_one_holder_at_a_time_and_what_a_run_leaves_is_removed(tmp_path):
    first = StateDir(tmp_path / "state")
    assert oct(first.path.stat().st_mode & 0o777) == "0o700"
    first.lock()
    first.write_up_file({"pid": os.getpid(), "url": "http://127.0.0.1:1"})
    first.run.mkdir()
    with pytest.raises(StateDirBusy, match=rf"pid {os.getpid()}\b.*{first.path}.*--state-dir"):
        StateDir(tmp_path / "state").lock()
    first.close()
    assert not (first.path / "up.json").exists() and not first.run.exists()
    second = StateDir(tmp_path / "state")
    second.lock()                                    # free again
    second.close()


def test_a_log_directory_elsewhere_is_locked_too(tmp_path):
    logs = tmp_path / "logs"
    first = StateDir(tmp_path / "a")
    first.lock(logs)
    second = StateDir(tmp_path / "b")
    with pytest.raises(StateDirBusy, match=rf"the log directory {logs}.*--log-dir"):
        second.lock(logs)
    second.lock(second.logs)                         # its own state directory was released; logs inside it
    second.close()
    first.close()


def test_a_restart_reuses_the_last_ports_unless_taken_or_given(tmp_path, caplog):
    last_free, held = free_ports(2)
    config = PlatformConfig(state_dir=str(tmp_path / "state"), port=0, ports={"deployer": 4321})
    platform = Platform(config)
    with socket.socket() as holder:                   # something else listens on the controller's old port
        holder.bind(("127.0.0.1", held))
        holder.listen()
        platform.state.remember_ports({"port": last_free, "controller": held, "deployer": 9999,
                                       "coordinator-0": last_free})
        platform._reuse_ports()
    assert platform.port == last_free                 # the config says 0: the last run's
    assert platform.ports.controller == 0             # taken meanwhile: a free one, with a warning
    assert "a port of the last run is taken" in caplog.text
    assert platform.ports.deployer == 4321            # given by the config: kept
    assert platform.replica_ports == {"coordinator-0": last_free}


class _Deployer:
    """The three Deployer calls `up` makes at its first start, on a dict (NOT_FOUND like the real one)."""

    def __init__(self, names):
        self.deployments, self.applied, self.deleted = set(names), [], []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def get(self, name):
        if name not in self.deployments:
            import grpc

            error = grpc.RpcError()
            error.code = lambda: grpc.StatusCode.NOT_FOUND
            error.details = lambda: "no such deployment"
            raise error
        return name

    def apply(self, spec):
        self.deployments.add(spec.name)
        self.applied.append(spec.name)

    def delete(self, name):
        self.get(name)
        self.deployments.discard(name)
        self.deleted.append(name)


def test_a_restart_keeps_an_unchanged_deployment_applies_a_changed_one_and_drops_a_removed_one(tmp_path):
    import json

    platform = Platform(PlatformConfig(state_dir=str(tmp_path / "state")))
    (spec,) = platform.specs
    as_config = json.loads(json.dumps(spec.to_dict()))
    deployer = _Deployer([spec.name, "gone-model", "by-hand"])
    platform._deployer_client = lambda *a: deployer
    platform.state.remember_applied({spec.name: as_config, "gone-model": {"name": "gone-model"}})

    platform._apply_deployments(first=True)
    assert deployer.applied == []                                  # unchanged since last applied: kept as it is
    assert deployer.deleted == ["gone-model"]                       # up made it; the config dropped it
    assert deployer.deployments == {spec.name, "by-hand"}           # `deploy apply`'s own is left alone
    assert platform.state.applied_specs() == {spec.name: as_config}

    platform.state.remember_applied({spec.name: {**as_config, "traffic": {"v0": 100}}})
    platform._apply_deployments(first=True)
    assert deployer.applied == [spec.name]                          # the config changed: it wins
    assert platform.state.applied_specs() == {spec.name: as_config}
