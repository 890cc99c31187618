"""Request ids stay unique in a forked child (the client pool's logic:
tests/unit/test_rpc_client_pool.py)."""

from __future__ import annotations

import os

from corral.rpc.client import new_request_id


def test_request_ids_are_unique_and_differ_in_a_forked_child():
    ids = {new_request_id() for _ in range(10000)}
    assert len(ids) == 10000
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report its next id and leave at once
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.close(write)
    child_id = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(pid, 0)
    mine = new_request_id()
    assert child_id[:16] != mine[:16], "a forked child must not reuse the parent's id prefix"
