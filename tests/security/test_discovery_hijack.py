"""Attack 1: name-resolve hijack (another user owns the fileroot, or anyone writes a record
in etcd) so the controller connects to the attacker and hands over the secret."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading

import pytest

from corral import BaseExperimentConfig, Job, SchedulingSpec
from corral import name_resolve_keys as K
from corral.auth import TrialKeys, sign_record
from corral.backends.local import LocalScheduler
from corral.discovery import make_name_resolve
from corral.discovery.signed import ForgedRecordError
from corral.errors import ConfigError
from corral.safedirs import default_fileroot, user_name
from tests.integration.test_name_resolve_contract import LocalEtcd
from tests.security.support import MALLORY, Listener, as_mallory, mallory

OTHER_SECRET = "b" * 64


@pytest.fixture
def shared_tmp():
    """A world-writable sticky directory like /tmp, where the other user can create files."""
    path = tempfile.mkdtemp(prefix="corral-sec-", dir="/tmp")
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _config(fileroot: str) -> BaseExperimentConfig:
    cfg = BaseExperimentConfig(experiment_name="sec", trial_name="hijack")
    cfg.cluster.fileroot = fileroot
    return cfg


def test_default_fileroot_is_per_user(tmp_path) -> None:
    assert default_fileroot() == f"/tmp/corral-{user_name()}"
    assert BaseExperimentConfig().cluster.fileroot == default_fileroot()


def test_fileroot_precreated_by_another_user_is_refused(shared_tmp) -> None:
    mallory()
    root = os.path.join(shared_tmp, "corral")
    made = as_mallory(["sh", "-c", f"mkdir -m 777 {root} && mkdir -p {root}/name_resolve"])
    assert made.returncode == 0, made.stderr
    assert os.stat(root).st_uid == mallory().pw_uid
    with pytest.raises(ConfigError, match=f"(?s)cluster.fileroot.*{root}.*{MALLORY}.*remove it"):
        LocalScheduler(exp_config=_config(root), gpu_devices=[])
    assert not os.path.exists(os.path.join(root, "secrets")), "nothing may be written there"


def test_fileroot_writable_by_others_is_refused(tmp_path) -> None:
    root = tmp_path / "open"
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.raises(ConfigError, match=f"(?s){root}.*other users can write.*chmod go-w"):
        LocalScheduler(exp_config=_config(str(root)), gpu_devices=[])


def test_record_directory_owned_by_another_user_is_refused(tmp_path, shared_tmp) -> None:
    records = os.path.join(shared_tmp, "records")
    assert as_mallory(["mkdir", "-m", "755", records]).returncode == 0
    with pytest.raises(ConfigError, match=f"(?s)nfs_record_root.*{records}.*{MALLORY}"):
        make_name_resolve({"type": "nfs", "nfs_record_root": records})


def test_private_directories_are_created_0700(tmp_path) -> None:
    root = tmp_path / "fresh"
    sched = LocalScheduler(exp_config=_config(str(root)), gpu_devices=[])
    try:
        for path in (root, root / "name_resolve"):
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, path
    finally:
        sched.close()


# ------------------------------------------------------------- forged records
@pytest.fixture
def slow_start(tmp_path):
    """Environment that makes a worker's interpreter start 3 s late (sitecustomize), so
    the attacker's record is in place before the real worker registers."""
    site = tmp_path / "slow"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import time\ntime.sleep(3)\n")
    os.chmod(tmp_path, 0o755)
    os.chmod(site, 0o755)
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path}


def _forge_until(stop: threading.Event, store, key: str, values: list[str]) -> None:
    i = 0
    while not stop.is_set():
        try:
            store.add(key, values[i % len(values)], replace=True)
        except Exception:
            pass
        i += 1
        stop.wait(0.005)


def _attack_create(sched, store, slow_start) -> tuple[Listener, BaseException | None]:
    """Keep forging role/0's address record while the controller waits for it."""
    listener = Listener()
    key = K.worker_address_key(sched.experiment_name, sched.trial_name, "victim", 0)
    forged = [
        listener.address,  # unsigned
        sign_record(TrialKeys(OTHER_SECRET), key, listener.address),  # another trial's key
    ]
    stop = threading.Event()
    attacker = threading.Thread(target=_forge_until, args=(stop, store, key, forged))
    attacker.start()
    error = None
    try:
        sched.create_workers(
            Job(role="victim", replicas=1, tasks=[SchedulingSpec(cpu=1, env_vars=slow_start)])
        )
    except BaseException as exc:
        error = exc
    finally:
        stop.set()
        attacker.join()
    return listener, error


def test_forged_address_record_is_refused_before_connecting(sched, slow_start) -> None:
    """Files name-resolve: a record not signed with the trial's key is refused, and the
    controller never connects to the address it names."""
    listener, error = _attack_create(sched, sched.name_resolve.inner, slow_start)
    try:
        assert isinstance(error, ForgedRecordError), error
        assert "not written by this trial's worker" in str(error)
        assert "victim/0" in str(error)
        assert listener.connections == 0 and not listener.received
    finally:
        listener.close()


@pytest.mark.etcd
def test_forged_etcd_record_is_refused_before_connecting(backend, tmp_path, slow_start) -> None:
    """etcd name-resolve (an unauthenticated gateway anyone on the network can write)."""
    etcd = LocalEtcd(tmp_path / "etcd")
    address = etcd.start()
    sched = backend.scheduler(name_resolve={"type": "etcd3", "etcd3_addr": address})
    attacker_store = make_name_resolve({"type": "etcd3", "etcd3_addr": address})
    try:
        listener, error = _attack_create(sched, attacker_store, slow_start)
        assert isinstance(error, ForgedRecordError), error
        assert "not written by this trial's worker" in str(error)
        assert listener.connections == 0 and not listener.received
        listener.close()
        # the trial still works: its own records verify
        (wid,) = sched.create_workers(Job(role="honest", replicas=1))
        assert sched.health(wid)["status"] == "ok"
    finally:
        attacker_store.close()
        sched.close()
        etcd.stop()


@pytest.mark.ray
def test_forged_ray_record_is_refused_before_connecting(backend, ray_cluster, slow_start) -> None:
    """Ray name-resolve (the GCS key-value store, which any process of the Ray cluster can
    write): the same record signing as the file and etcd stores (issue 24, defect 3)."""
    sched = backend.scheduler(name_resolve={"type": "ray"})
    attacker_store = make_name_resolve({"type": "ray", "address": ray_cluster.address})
    try:
        assert sched.name_resolve.describe()["type"] == "ray"
        listener, error = _attack_create(sched, attacker_store, slow_start)
        assert isinstance(error, ForgedRecordError), error
        assert "not written by this trial's worker" in str(error)
        assert listener.connections == 0 and not listener.received
        listener.close()
        # the trial still works: its own records verify
        (wid,) = sched.create_workers(Job(role="honest", replicas=1))
        assert sched.health(wid)["status"] == "ok"
        key = K.worker_address_key(sched.experiment_name, sched.trial_name, "honest", 0)
        assert attacker_store.get(key).startswith("corral-signed")  # as stored in the GCS
    finally:
        attacker_store.close()
        sched.close()


def test_corral_stop_does_not_follow_a_forged_record(tmp_path) -> None:
    """The CLI (ps, stop) reads records too: a rewritten address is refused, not contacted."""
    root = tmp_path / "root"
    sched = LocalScheduler(exp_config=_config(str(root)), gpu_devices=[])
    listener = Listener()
    try:
        (wid,) = sched.create_workers(Job(role="victim", replicas=1))
        key = K.worker_address_key("sec", "hijack", "victim", 0)
        sched.name_resolve.inner.add(key, listener.address, replace=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        out = subprocess.run(
            [sys.executable, "-m", "corral.cli", "--fileroot", str(root), "stop", "sec", "hijack"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert "not written by this trial's worker" in out.stderr, out
        assert listener.connections == 0 and not listener.received
    finally:
        listener.close()
        sched.close()
