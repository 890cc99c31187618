"""A worker whose log file cannot be written (disk full) keeps answering; the output that
could not be written is dropped and counted, never blocks the worker.

The full disk is /dev/full behind the replica's log path (writes fail with ENOSPC), set
up before the worker starts; the role and merged logs stay writable."""

from __future__ import annotations

import asyncio
import os

from corral import Job, SchedulingSpec
from corral.logs import merged_log_path, replica_log_path

ECHO = "corral.testing.engines.EchoEngine"


def test_a_chatty_worker_with_a_full_log_disk_keeps_answering(backend):
    lines: list[str] = []
    sched = backend.scheduler(progress=lines.append)
    try:
        path = replica_log_path(sched.log_dir, "chatty", 0)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.symlink("/dev/full", path)
        (wid,) = sched.create_workers(Job(role="chatty", replicas=1, tasks=[SchedulingSpec()]))
        asyncio.run(sched.create_engine(wid, ECHO, "e"))
        # 4 x 2 MB of output: far more than any pipe holds, so a stuck log copier would
        # block the worker's prints and the calls would time out
        for _ in range(4):
            assert sched.call_engine(wid, "chatter", "e", 20000, rpc_meta={"timeout": 60}) > 0
        assert sched.call_engine(wid, "echo", "e", 7, rpc_meta={"timeout": 30}) == 7
        assert sched.health(wid)["status"] == "ok"
        with open(merged_log_path(sched.log_dir), "rb") as fh:
            assert b"[chatty/0] xxxx" in fh.read()
        if backend.name == "local":  # the controller copies the logs itself: it says why
            assert any("No space left on device" in line for line in lines), lines
    finally:
        sched.close()
