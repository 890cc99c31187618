"""The Slurm backend: one ``sbatch`` job per role, one ``srun`` task per worker.

Nothing is imported here (``corral stop`` and the pure renderer stay cheap); the
registry (corral.backends) names ``scheduler:SlurmScheduler``.

- ``scheduler``: SlurmScheduler, AReaL's constructor over the shared Scheduler;
- ``launcher``: SlurmLauncher, which composes the parts below around one RoleJobs;
- ``jobs``: RoleJob and RoleJobs, the state the parts share (jobs, specs, steps, lock);
- ``submit``: JobSubmitter, a role's script rendered, checked against the cluster, sbatched;
- ``job_watch``: JobWatch, which replicas died and why, pending reasons, hopeless reasons;
- ``job_stop``: JobStopper and wait_gone, jobs ended or cancelled through an outage;
- ``replica_restart``: ReplicaRestarts, a dead replica again, in its job or as a new one;
- ``restart_step``: the ``srun --overlap`` step a restart inside the job runs as;
- ``elastic_jobs``, ``requeues``, ``adoption``: the elastic, preemption and adoption parts;
- ``leftover_jobs``: a dead controller's jobs cancelled (``corral stop``, the registry);
- ``queue``: job states and the batched ``squeue``/``scontrol`` query;
- ``commands``: the Slurm commands' runner (PATH, timeouts, slurmctld unreachable);
- ``job_files``: the jobs' files in the log directory (scripts, batch log, exit and
  place files) and what they say;
- ``batch_script``, ``batch_params``: the pure batch and task script renderer, its inputs;
- ``layout``: how a role's workers map onto nodes; ``members``: multi-node instances;
- ``inventory``, ``resource_names``: what the cluster has (nodes, GPUs; partitions,
  features, reservations) and whether a role can ever be placed.
"""
