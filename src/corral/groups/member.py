"""The worker's routes for cross-role process groups: ``/group/open`` (the first member
starts the group's ``TCPStore`` on a free port), ``/group/join`` (every member, at once,
builds its process group over a ``PrefixStore`` of it) and ``/group/destroy``.

A member that never joins: the others' process-group constructors give up after the
group's timeout, and the error names the members whose ``joined/<rank>`` key never
appeared in the store. torch is imported by these routes only.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from typing import Any

from corral.errors import ProcessGroupError
from corral.groups import GROUPS, ProcessGroup

BACKENDS = ("gloo", "nccl")


def torch_backend(backend: str) -> tuple[str, str]:
    """``(torch class name, tensor device)`` of a group backend: the only difference
    between "gloo" and "nccl" in corral's code."""
    if backend == "gloo":
        return "ProcessGroupGloo", "cpu"
    if backend == "nccl":
        return "ProcessGroupNCCL", "cuda"
    raise ProcessGroupError(f"backend {backend!r} is not one of {BACKENDS}")


def build(backend: str, store: Any, rank: int, size: int, timeout: float, host: str) -> Any:
    """The torch process group of one member (blocks until every member has joined)."""
    import torch.distributed as dist

    class_name, _device = torch_backend(backend)
    cls = getattr(dist, class_name, None)
    if cls is None:
        raise ProcessGroupError(
            f'backend="{backend}" needs torch.distributed.{class_name}, which this torch '
            f"({_torch_version()}) lacks: install a CUDA build of torch on GPU workers, or "
            'use backend="gloo"'
        )
    if backend == "gloo":
        options = cls._Options()
        options._devices = [cls.create_device(hostname=host)]
        options._timeout = timedelta(seconds=timeout)
        return cls(store, rank, size, options)
    options = cls.Options()
    options._timeout = timedelta(seconds=timeout)
    return cls(store, rank, size, options)


def _torch_version() -> str:
    import torch

    return torch.__version__


class GroupMember:
    """The group routes of one worker."""

    def __init__(self, worker_id: str, host: str):
        self.worker_id = worker_id
        self.host = host  # the address this worker advertises: the store and gloo bind here
        self._stores: dict[str, Any] = {}  # name -> the TCPStore this worker serves
        self._lock = threading.Lock()

    def open(self, p: dict) -> dict:
        import torch.distributed as dist

        name, size, timeout = str(p["name"]), int(p["world_size"]), float(p["timeout"])
        with self._lock:
            if name in self._stores or name in GROUPS:
                raise ProcessGroupError(
                    f"worker {self.worker_id} already has a process group {name!r}; destroy "
                    "it first (sched.destroy_process_group) or pick another name"
                )
            store = dist.TCPStore(
                self.host, 0, size, is_master=True,
                timeout=timedelta(seconds=timeout), wait_for_workers=False,
            )  # fmt: skip
            self._stores[name] = store
        return {"addr": self.host, "port": int(store.port)}

    def join(self, p: dict) -> dict:
        import torch.distributed as dist

        name, rank, size = str(p["name"]), int(p["rank"]), int(p["world_size"])
        timeout, backend = float(p["timeout"]), str(p["backend"])
        members = [str(m) for m in p["members"]]
        torch_backend(backend)
        store = self._stores.get(name)
        if store is None:
            store = dist.TCPStore(
                str(p["addr"]), int(p["port"]), size, is_master=False,
                timeout=timedelta(seconds=timeout),
            )  # fmt: skip
        prefixed = dist.PrefixStore(f"corral/groups/{name}/", store)
        prefixed.set(f"host/{rank}", _host_token())  # before joined/: read after build
        prefixed.set(f"joined/{rank}", self.worker_id)
        try:
            group = build(backend, prefixed, rank, size, timeout, self.host)
        except ProcessGroupError:
            raise
        except Exception as exc:
            missing = [
                f"{m} (rank {r})"
                for r, m in enumerate(members)
                if not _has_key(prefixed, f"joined/{r}")
            ]
            who = ", ".join(missing) or "none missing at the end; a member could not connect"
            raise ProcessGroupError(
                f"process group {name!r}: {self.worker_id} (rank {rank}) gave up after "
                f"{timeout:g} s waiting for every member to join; never joined: {who}. Check "
                "that those workers are alive and reachable, or raise timeout= "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
            ) from None
        tokens = {prefixed.get(f"host/{r}").decode() for r in range(size)}
        same_host = len(tokens) == 1 and "off" not in tokens  # every member reads the same keys
        GROUPS[name] = ProcessGroup(
            name, rank, size, group, backend, members, prefixed, same_host=same_host
        )
        return {"rank": rank}

    def destroy(self, p: dict) -> bool:
        name = str(p["name"])
        with self._lock:
            group = GROUPS.pop(name, None)
            had = group is not None
            if group is not None:
                group.close()
            had = self._stores.pop(name, None) is not None or had
        return had

    def destroy_all(self) -> None:
        for name in list(GROUPS):
            self.destroy({"name": name})


def _host_token() -> str:
    """This member's ``shm.host_token()`` ("off" when shared memory is off here:
    ``CORRAL_SHM=0`` or ``CORRAL_GROUP_SHM=0``); a group uses its same-host path only if
    every member's token is the same and none is "off"."""
    from corral.rpc import shm

    if os.environ.get("CORRAL_GROUP_SHM", "1") == "0":
        return "off"
    return shm.host_token() or "off"


def _has_key(store: Any, key: str) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:
        return False
