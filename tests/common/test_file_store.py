"""`FileStore`: what one process wrote is there when the next one opens the file; what expires
(leases, TTL'd values) is not; a file that is not a store of this prefix is refused, not emptied.
And `running_up`: an `up.json` names a running `up` only while that very process lives."""

from __future__ import annotations

import json
import os

import pytest

from mindmotor.common.file_store import FileStore
from mindmotor.common.store import open_store
from mindmotor.common.store_epoch import store_epoch
from mindmotor.common.up_state import default_state_dir, running_up
from mindmotor.runtime.detached_process import proc_start_time


@pytest.mark.asyncio
async def test_what_one_process_wrote_the_next_one_reads(tmp_path):
    path = tmp_path / "state" / "store.json"
    store = open_store(f"file:{path}", "p:deployer:")
    assert isinstance(store, FileStore) and store.kind == "file"
    epoch, created = await store_epoch(store)
    assert created
    assert await store.hcompare_and_set("deployments", "d", None, {"traffic": {"v1": 100}})
    assert await store.hcompare_and_set("deployments", "d", {"traffic": {"v1": 100}}, {"traffic": {"v2": 100}})
    await store.hset("deployments", "gone", {"x": 1})
    assert await store.hdel("deployments", "gone")
    await store.incr("generation")
    assert await store.try_acquire_lease("owner", "me", ttl_s=60)
    await store.set("cached", 1, ttl_s=60)

    again = FileStore(path, "p:deployer:")
    assert await again.hgetall("deployments") == {"d": {"traffic": {"v2": 100}}}
    assert await store_epoch(again) == (epoch, False)          # not taken for a store that lost its data
    assert await again.get("generation") == 1
    assert await again.lease_holder("owner") is None and await again.get("cached") is None
    assert not [p for p in path.parent.iterdir() if p.name != path.name]    # no temporary file left


def test_a_file_that_is_not_a_store_of_this_prefix_is_refused(tmp_path):
    path = tmp_path / "store.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="store.json"):
        FileStore(path, "p:")
    path.write_text(json.dumps({"format": 1, "prefix": "other:", "hashes": {}, "values": {}}))
    with pytest.raises(ValueError, match="prefix"):
        FileStore(path, "p:")


def test_an_up_file_names_a_running_up_only_while_that_process_lives(tmp_path):
    up = tmp_path / "up.json"
    assert running_up(tmp_path) is None
    mine = {"pid": os.getpid(), "pid_start": proc_start_time(os.getpid()), "deployer": "127.0.0.1:1"}
    up.write_text(json.dumps(mine))
    assert running_up(tmp_path) == mine
    up.write_text(json.dumps({**mine, "pid_start": mine["pid_start"] + 1}))    # the pid was reused
    assert running_up(tmp_path) is None
    up.write_text(json.dumps({**mine, "pid": 2**22 + 1}))                      # no such process
    assert running_up(tmp_path) is None
    up.write_text("{")
    assert running_up(tmp_path) is None


def test_the_default_state_directory():
    assert default_state_dir({"MINDMOTOR_STATE_DIR": "/srv/mm", "XDG_DATA_HOME": "/x"}) == default_state_dir(
        {"MINDMOTOR_STATE_DIR": "/srv/mm"})
    assert str(default_state_dir({"XDG_DATA_HOME": "/x"})) == "/x/mindmotor"
    assert str(default_state_dir({"HOME": "/home/me"})) == "/home/me/.local/share/mindmotor"
