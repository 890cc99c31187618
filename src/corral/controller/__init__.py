"""The controller: the one ``Scheduler`` every backend shares, and the features it is
made of. Nothing is imported here (a backend imports ``corral.controller.scheduler``).

- ``scheduler``: the public API, each method a short hand-over to a feature;
- ``parts``: ``ControllerParts``, the controller's state, owned by one object;
- ``wiring``: builds the parts for one launcher and one trial;
- ``settings``: AReaL's keywords and the experiment config, resolved once;
- roles: ``create`` (launched, reused or forked), ``launch`` (a role's environment,
  launch, registration, lookups), ``forking``, ``rendezvous``, ``multinode_instances``,
  ``configure_workers``, ``role_table`` (roles, workers, the checks of a new role);
- features: ``elastic`` (scale), ``preemption`` (wait_role), ``restarts``
  (max_restarts), ``adoption`` (``attach=True``: a new controller adopts the workers
  of a dead one that asked them to ``outlive_controller``), ``dryrun``;
- calls: ``caller`` (every request, one retry policy), ``engine_calls``, ``dispatch``;
- watching: ``worker_watch`` (registration, deaths, diagnosis), ``health_monitor``;
- the trial: ``trial_hold`` (what is held while workers run), ``run_lease`` (the
  controller lease and run identity), ``leftovers`` (what a dead run left);
- the end: ``closing`` (delete_workers, close) over ``teardown`` (roles in order).

Every feature receives the parts; none imports ``Scheduler``.
"""
