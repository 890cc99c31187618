"""Slurm: the members of multi-node instances (corral.multinode). A role whose workers
hold ``k`` nodes runs one task per node; the task script makes node rank 0 the worker and
every other node a member worker (role ``<role>.members``), and each member records its
node so that a dead member is reported as its instance's death, naming the node."""

from __future__ import annotations

import os

from corral.backends.slurm.job_files import describe_exit_code, exit_code_path, read_exit_file
from corral.launcher import WorkerExit
from corral.multinode import NNODES, NODE_RANK, member_index, member_role
from corral.paths import replica_log_path


def task_lines(role: str, log_dir: str, k: int, quote) -> list[str]:
    """Bash lines that pick this task's role, index and log directory from its
    SLURM_PROCID (k tasks per instance, one per node) and export the node variables
    (the head's address and port come from the controller once the worker is up)."""
    role_dir = f"{log_dir.rstrip('/')}/{role}"
    members = f"{log_dir.rstrip('/')}/{member_role(role)}"
    return [
        f"corral_rank=$(( ${{SLURM_PROCID:-0}} % {k} ))",
        f"corral_index=$(( ${{CORRAL_INDEX_OFFSET:-0}} + ${{SLURM_PROCID:-0}} / {k} ))",
        f"corral_role={quote(role)}",
        f"corral_dir={quote(role_dir)}",
        "if (( corral_rank > 0 )); then  # a member, on node corral_rank of the instance",
        f"    corral_role={quote(member_role(role))}",
        f"    corral_dir={quote(members)}",
        f"    corral_index=$(( corral_index * {k - 1} + corral_rank - 1 ))",
        '    export CORRAL_ROLE="$corral_role"',
        "fi",
        'export CORRAL_INDEX="$corral_index"',
        f'export {NNODES}={k} {NODE_RANK}="$corral_rank"',
    ]


def node_line() -> str:
    """Where a task runs, for the report of its death."""
    return 'printf "%s\\n" "${SLURMD_NODENAME:-$(hostname)}" > "$corral_dir/${corral_index}.node"'


def member_exits(
    log_dir: str, role: str, indices: list[int], job_id: str, k: int
) -> dict[int, WorkerExit]:
    """Instances among ``indices`` with a member that exited: the first such member's
    node, rank and exit, as the instance's death."""
    dead: dict[int, WorkerExit] = {}
    members = member_role(role)
    for index in indices:
        for rank in range(1, k):
            m = member_index(index, rank, k)
            code = read_exit_file(exit_code_path(log_dir, members, m, job_id))
            if code is None:
                continue
            node = "?"
            try:
                with open(os.path.join(log_dir, members, f"{m}.node")) as fh:
                    node = fh.read().strip() or "?"
            except OSError:
                pass
            dead[index] = WorkerExit(
                f"member {members}/{m} on node {node} (node rank {rank} of {k}) "
                f"{describe_exit_code(code)}",
                code,
                replica_log_path(log_dir, members, m),
            )
            break
    return dead
