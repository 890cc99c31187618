"""Multi-node instances' arithmetic (corral.multinode, backends/slurm/layout.py): whole
nodes only, cpu/mem shared per node, member indices, the node variables."""

from __future__ import annotations

import pytest

from corral.backends.slurm.layout import plan_layout
from corral.errors import ConfigError, GPURequestError
from corral.instances import head_of, start_instances
from corral.multinode import (
    Instance,
    check_multinode,
    member_index,
    member_place,
    nodes_of,
    per_node,
)
from corral.spec import Job, SchedulingSpec, Worker, normalize_job


def _job(gpu, cpu=8, mem=8, replicas=1):
    spec = SchedulingSpec(gpu=gpu, cpu=cpu, mem=mem)
    return normalize_job(Job(role="server", replicas=replicas, tasks=[spec]))


def test_whole_nodes_only():
    assert nodes_of(SchedulingSpec(gpu=16), 8) == 2
    assert nodes_of(SchedulingSpec(gpu=8), 8) == 1
    assert nodes_of(SchedulingSpec(gpu=12), 8) == 0
    assert check_multinode(_job(24, cpu=6, mem=3), 8, "ray", True) == 3
    with pytest.raises(GPURequestError) as info:
        check_multinode(_job(12), 8, "ray", True)
    assert "12 = 1.5 x 8" in str(info.value) and "gpu=8 or 16" in str(info.value)


def test_one_host_backends_refuse_and_cpu_mem_must_divide():
    with pytest.raises(GPURequestError, match="the local backend runs on one host"):
        check_multinode(_job(16), 8, "local", False)
    with pytest.raises(ConfigError, match=r"cpu=3.*3 % 2 = 1"):
        check_multinode(_job(16, cpu=3), 8, "ray", True)
    with pytest.raises(ConfigError, match=r"mem=5.*5 % 2 = 1"):
        check_multinode(_job(16, mem=5), 8, "slurm", True)
    assert per_node(SchedulingSpec(gpu=16, cpu=8, mem=6), 2).gpu == 8
    spec = SchedulingSpec(gpu=16, cpu=8, mem=8, max_restarts=1)
    restartable = normalize_job(Job(role="server", replicas=1, tasks=[spec]))
    with pytest.raises(ConfigError, match="max_restarts=1"):
        check_multinode(restartable, 8, "slurm", True)


def test_member_indices_round_trip():
    k = 3
    seen = [member_index(i, r, k) for i in range(4) for r in range(1, k)]
    assert seen == list(range(8))
    assert [member_place(m, k) for m in (0, 1, 2, 5)] == [(0, 1), (0, 2), (1, 1), (2, 2)]


def test_slurm_layout_of_two_instances_of_two_nodes():
    layout = plan_layout(2, SchedulingSpec(gpu=16, cpu=16, mem=64), 8)
    assert (layout.nodes, layout.ntasks, layout.ntasks_per_node) == (4, 4, 1)
    assert (layout.gpus_per_node, layout.cpus_per_task, layout.mem_per_node_gb) == (8, 8, 32)
    assert layout.nodes_per_worker == 2


def test_start_instances_lists_member_hosts_and_hands_out_node_variables():
    def worker(role, index, host, ports):
        return Worker(id=f"{role}/{index}", ip=f"10.0.0.{index}", worker_ports=ports, host=host)

    workers = [worker("s", 0, "n1", [100, 101, 102]), worker("s", 1, "n3", [200, 201])]
    members = [worker("s.members", 0, "n2", [1]), worker("s.members", 1, "n4", [2])]
    given = []
    instances, found = start_instances(
        workers, 2, lambda role, n: members[:n] if role == "s.members" else [], given.extend
    )
    assert found == members and workers[1].member_hosts == ["n4"]
    assert instances[0].hosts == ("n1", "n2") and instances[0].head == ("10.0.0.0", 102)
    assert head_of(workers[1]) == ("10.0.0.1", 201)
    env = dict((w.id, e) for w, e in given)
    assert env["s.members/1"] == {
        "CORRAL_NNODES": "2", "CORRAL_NODE_RANK": "1",
        "CORRAL_HEAD_ADDR": "10.0.0.1", "CORRAL_HEAD_PORT": "201",
    }  # fmt: skip
    assert env["s/0"]["CORRAL_NODE_RANK"] == "0"
    assert isinstance(instances[0], Instance) and instances[0].nnodes == 2


def test_dry_runs_show_the_nodes_of_an_instance(tmp_path):
    from corral.backends import scheduler_class
    from corral.config import BaseExperimentConfig

    cfg = BaseExperimentConfig(experiment_name="dr", trial_name="t1")
    cfg.cluster.fileroot = str(tmp_path)
    cfg.cluster.n_gpus_per_node = 8
    job = Job(role="server", replicas=1, tasks=[SchedulingSpec(gpu=16, cpu=4, mem=8)])
    ray = scheduler_class("ray")(exp_config=cfg, dry_run=True).dry_run(job)
    assert "strategy='STRICT_SPREAD'" in ray and "'GPU': 8.0}, {" in ray, ray
    assert "'num_gpus': 8.0" in ray and "server.members actor per node" in ray, ray
    slurm = scheduler_class("slurm")(exp_config=cfg, dry_run=True).dry_run(job)
    assert "#SBATCH --nodes=2\n" in slurm and "#SBATCH --gres=gpu:8\n" in slurm, slurm
    assert "corral_role=server.members" in slurm
    with pytest.raises(GPURequestError, match="one host"):
        scheduler_class("local")(exp_config=cfg, dry_run=True, gpu_devices=list(range(8))).dry_run(
            job
        )
