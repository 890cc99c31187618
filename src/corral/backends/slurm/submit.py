"""Rendering, checking and submitting a role's batch script: the launcher's settings
(GPUs per node, options, interpreter, requeue and signal) and the one ``sbatch`` call."""

from __future__ import annotations

from corral.backends.backend_options import SlurmOptions
from corral.backends.slurm.batch_params import SbatchParams, check_container
from corral.backends.slurm.batch_script import render_sbatch_script
from corral.backends.slurm.commands import run_command
from corral.backends.slurm.inventory import ClusterFacts
from corral.backends.slurm.layout import check_homogeneous, plan_layout
from corral.backends.slurm.queue import SlurmQueue
from corral.errors import PlacementError
from corral.spec import NormalizedJob
from corral.worker import env as E


class JobSubmitter:
    """The batch script of a role from the launcher's settings; ``check`` refuses what
    the cluster can never place, ``submit`` sbatches a written script."""

    def __init__(
        self,
        *,
        n_gpus_per_node: int,
        options: SlurmOptions,
        python: str,
        dry_run: bool,
        requeue: bool,
        signal: str | None,
        queue: SlurmQueue,
        cluster: ClusterFacts,
    ) -> None:
        self.n_gpus_per_node = n_gpus_per_node
        self.options = options
        self.python = python
        self.dry_run = dry_run
        self.requeue = requeue
        self.signal = signal
        self.queue = queue
        self.cluster = cluster

    def params(self, job: NormalizedJob, env: dict[str, str], log_dir: str) -> SbatchParams:
        """The sbatch parameters of a role; ``env`` is replica 0's worker environment."""
        spec = check_homogeneous(job.tasks)
        common = {k: v for k, v in env.items() if k not in (E.INDEX, E.SECRET)}
        # the spec's env_vars are rendered last by the renderer itself
        for key in spec.env_vars:
            common.pop(key, None)
        experiment, trial = common[E.EXPERIMENT], common[E.TRIAL]
        return SbatchParams(
            job_name=f"{experiment}:{trial}:{job.role}",
            role=job.role,
            replicas=job.replicas,
            spec=spec,
            n_gpus_per_node=self.n_gpus_per_node,
            log_dir=log_dir,
            experiment=experiment,
            trial=trial,
            name_resolve=common[E.NAME_RESOLVE],
            secret_file=common.get(E.SECRET_FILE, ""),
            python=self.python,
            env=common,
            lease_timeout=float(common.get(E.LEASE_TIMEOUT, E.DEFAULT_LEASE_TIMEOUT)),
            options=self.options,
            requeue=self.requeue,
            signal=self.signal,
        )

    def render(self, job: NormalizedJob, env: dict[str, str], log_dir: str) -> str:
        return render_sbatch_script(self.params(job, env, log_dir))

    def check(self, job: NormalizedJob) -> None:
        """PlacementError if the cluster can never place ``job`` (not in a dry run)."""
        spec = check_homogeneous(job.tasks)
        check_container(spec)
        layout = plan_layout(job.replicas, spec, self.n_gpus_per_node)
        if self.dry_run:
            return
        problem = self.cluster.placement_problem(
            spec.partition or self.options.partition,
            spec.constraint,
            spec.reservation,
            layout.nodes,
            layout.gpus_per_node,
        )
        if problem is not None:
            name, value, why = problem
            raise PlacementError(
                f"{job.role}: {name}", value, f"{job.role} can never be placed: {why}"
            )

    def submit(self, path: str, job: NormalizedJob, what: str) -> str:
        """sbatch the script at ``path``; its job id, or PlacementError saying why not."""
        # the job inherits sbatch's umask: its logs and directories are private to the user
        r = run_command(["sbatch", "--parsable", path], umask=0o077)
        job_id = r.stdout.strip().split(";")[0]
        if r.returncode != 0 or not job_id.isdigit():
            spec = job.tasks[0]
            layout = plan_layout(job.replicas, spec, self.n_gpus_per_node)
            message = (r.stderr or r.stdout).strip() or f"exit code {r.returncode}"
            raise PlacementError(
                f"{job.role}: sbatch",
                f"{job.replicas} worker(s)",
                f"Slurm refused the {what} job: {message}. Asked for {job.replicas} "
                f"worker(s) x (cpu={spec.cpu}, gpu={spec.gpu}, mem={spec.mem}G) on "
                f"{layout.nodes} node(s) ({layout.ntasks_per_node} per node"
                + (f", gres gpu:{layout.gpus_per_node}" if layout.gpus_per_node else "")
                + f"); check n_gpus_per_node and the partition's nodes (sinfo). Script: {path}",
            )
        self.queue.invalidate()
        return job_id
