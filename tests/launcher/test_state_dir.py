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
