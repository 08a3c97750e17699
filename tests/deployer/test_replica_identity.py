"""Each local replica's own certificate (deployer/backends/replica_identity.py): under mutual TLS a
deployer without the worker CA refuses to start (its replicas could not prove who they are) and
one given the root CA in its place too; a running replica whose certificate would expire within a
day is drained, one replica of a version at a time (so that the reconcile loop starts it again
with a new one), and its files go with it. (That every replica presents its own identity under a
real deployer: tests/security/test_worker_identity.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict

import pytest

from mindmotor.common import certs, rpc
from mindmotor.common.waiting import wait_until
from mindmotor.vocabulary import ReplicaPhase
from mindmotor.deployer.backends.base import Replica
from mindmotor.deployer.backends.local import STATE_FILE, LocalBackend
from mindmotor.deployer.backends.replica_identity import ReplicaIdentities
from mindmotor.runtime.detached_process import proc_start_time

RUNNING, STOPPING = ReplicaPhase.RUNNING, ReplicaPhase.STOPPING


def test_under_mutual_tls_the_deployer_needs_the_worker_ca(tmp_path):
    certs.init_ca(tmp_path / "pki")
    own = certs.issue(tmp_path / "pki", "deployer", "deployer")
    sec = rpc.RpcSecurity.load(str(own.ca), str(own.cert), str(own.key))
    with pytest.raises(ValueError, match="--worker-ca-cert and --worker-ca-key"):
        ReplicaIdentities.from_settings(None, None, sec, tmp_path, "127.0.0.1")
    with pytest.raises(ValueError, match="is not a worker CA"):                    # the root will not do
        ReplicaIdentities.from_settings(str(own.ca), str(tmp_path / "pki" / "ca-key.pem"), sec, tmp_path, "127.0.0.1")
    worker_ca = certs.init_worker_ca(tmp_path / "pki")
    identities = ReplicaIdentities.from_settings(str(worker_ca.cert), str(worker_ca.key), sec, tmp_path, "10.1.2.3")
    env, expires = identities.issue("demo-v1-0")
    assert certs.identity_of(open(env[rpc.ENV_CERT], "rb").read()) == certs.Identity("worker", "demo-v1-0")
    assert certs.verify_peer(open(env[rpc.ENV_CERT], "rb").read(), own.ca.read_bytes()) is None
    assert set(env) == {rpc.ENV_CERT, rpc.ENV_KEY} and expires is not None
    identities.forget("demo-v1-0")
    assert not (tmp_path / "certs" / "demo-v1-0").exists()
    plain = ReplicaIdentities.from_settings(None, None, rpc.RpcSecurity(), tmp_path, "127.0.0.1")
    assert plain.issue("demo-v1-0") == ({}, None)                                 # token or open mode


# a replica that notes SIGTERM in a file and stays until it is killed (a drain that takes a while)
REPLICA = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[1] + ".sigterm", "w").close())
open(sys.argv[1] + ".up", "w").close()
time.sleep(60)
"""


@pytest.mark.asyncio
async def test_replicas_whose_certificates_expire_within_a_day_are_drained_one_at_a_time(tmp_path):
    now = time.time()
    records, processes = {}, {}
    for slot, expires_in in ((0, 3600.0), (1, 7200.0), (2, 10 * 86400.0)):
        instance = f"demo-v1-{slot}"
        proc = subprocess.Popen([sys.executable, "-c", REPLICA, str(tmp_path / instance),
                                 "--worker-id", instance])
        processes[instance] = proc
        (tmp_path / "certs" / instance).mkdir(parents=True)
        records[f"demo/v1/{slot}"] = {
            "replica": asdict(Replica("demo", "v1", slot, RUNNING, instance_id=instance, started_at=now)),
            "process": {"pid": proc.pid, "start_time": proc_start_time(proc.pid), "out_path": str(tmp_path / "x.out"),
                        "cmdline_mark": f"--worker-id\0{instance}\0"},
            "ready": {"port": "1"}, "cert_expires": now + expires_in}
    (tmp_path / STATE_FILE).write_text(json.dumps(records))
    wait_until(lambda: all((tmp_path / f"{i}.up").exists() for i in processes), timeout=10, interval=0.02,
               what="the replicas to be up")
    backend = LocalBackend("127.0.0.1:1", tmp_path, anchor=os.getpid())

    async def phases() -> dict[str, str]:
        return {r.instance_id: r.phase for r in await backend.observe()}

    try:
        assert backend.adopted == 3
        assert await phases() == {"demo-v1-0": STOPPING, "demo-v1-1": RUNNING, "demo-v1-2": RUNNING}
        assert await phases() == {"demo-v1-0": STOPPING, "demo-v1-1": RUNNING, "demo-v1-2": RUNNING}   # one at a time
        wait_until(lambda: (tmp_path / "demo-v1-0.sigterm").exists(), timeout=10, interval=0.02,
                   what="replica 0 to get SIGTERM")
        processes["demo-v1-0"].kill()                                             # it has drained
        processes["demo-v1-0"].wait()
        assert await phases() == {"demo-v1-1": STOPPING, "demo-v1-2": RUNNING}     # its slot is free; the next one
        assert not (tmp_path / "certs" / "demo-v1-0").exists() and (tmp_path / "certs" / "demo-v1-2").exists()
    finally:
        for proc in processes.values():
            proc.kill()
            proc.wait()
