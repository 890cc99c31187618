"""Render the sbatch script that starts one role on Slurm.

Pure text generation: nothing here starts a process or touches the filesystem. What a
script depends on (:class:`SbatchParams`) and the checks of each value are in
:mod:`corral.backends.slurm.batch_params` (its :func:`check_container`, which only checks that
a container image exists, is the one piece with I/O).

The generated job is one ``sbatch`` allocation per role with one ``srun`` step that
starts one task per replica. Each task runs a small bash script
(:func:`render_task_script`) that

* picks the task's GPUs from ``SLURM_LOCALID`` and exports ``CUDA_VISIBLE_DEVICES``
  before Python starts,
* runs the additional bash commands of the spec,
* runs the worker (``<python> -m corral.worker``, or the spec's ``cmd``, optionally
  inside ``apptainer exec``) with stdout and stderr merged and line-buffered, copied to
  ``<log_dir>/<role>/<index>.log`` and, with a ``[role/index] `` prefix on every line,
  appended to ``<log_dir>/<role>.log`` and ``<log_dir>/merged.log``,
* writes the worker's exit code to ``<log_dir>/<role>/<index>.exit`` and exits with it.

The worker index is ``CORRAL_INDEX_OFFSET + SLURM_PROCID``: the task script computes it
(to name the log file) and exports it as ``CORRAL_INDEX``, and the node's name
(``SLURMD_NODENAME``) as ``CORRAL_NODE``. The worker reads only those CORRAL_* variables:
what Slurm says to a task is this script's to translate.
"""

from __future__ import annotations

import json
import shlex

from corral.backends.slurm import members
from corral.backends.slurm.batch_params import (
    SIGNAL_RE,
    SbatchParams,
    check_env,
    check_path,
    directive_value,
    name_resolve_json,
)
from corral.backends.slurm.job_files import sbatch_log_path
from corral.errors import ConfigError
from corral.paths import merged_log_path, role_log_path
from corral.resources import slurm_directives
from corral.spec import CONTAINER_TYPES, validate_role_name
from corral.worker import env as E


def _contract_args(p: SbatchParams) -> str:
    """AReaL's arguments after a spec's ``cmd`` (corral.worker.args); the port is 0 (the
    node is not known before the job starts: the worker picks one and publishes it)."""
    if not p.spec.cmd or _worker_argv(p)[-3:] == [p.python, "-m", "corral.worker"]:
        return ""

    from corral.worker.args import contract_args

    resolve = p.name_resolve if not isinstance(p.name_resolve, str) else json.loads(p.name_resolve)
    args = contract_args(
        port=0,
        experiment=p.experiment,
        trial=p.trial,
        role=p.role,
        index=-1,
        name_resolve=dict(resolve),
        fileroot=str(p.env.get("CORRAL_FILEROOT", "")),
    )
    words = ['"$corral_index"' if a == "-1" else _q(a) for a in args]
    return " " + " ".join(words)


def _worker_argv(p: SbatchParams) -> list[str]:
    """The command of one task: the worker, or the spec's cmd, optionally in apptainer."""
    if p.spec.cmd:
        from corral.worker.args import command_argv

        argv = command_argv(p.spec.cmd, p.python or "python3", rewrite_python=False)
    else:
        if not p.python:
            raise ConfigError("python", p.python, "give the python executable of the workers")
        argv = [p.python, "-m", "corral.worker"]
    ctype, image, mount = p.resolved_container()
    if ctype not in CONTAINER_TYPES:
        raise ConfigError("container_type", ctype, f"use one of {', '.join(CONTAINER_TYPES)}")
    if ctype == "apptainer":
        if not image:
            raise ConfigError(
                "SchedulingSpec.image", image, "container_type='apptainer' needs image=<.sif>"
            )
        wrap = [p.apptainer, "exec", "--nv"]
        if mount:
            wrap += ["--bind", mount]
        argv = [*wrap, image, *argv]
    return argv


def _srun_extra(p: SbatchParams) -> list[str]:
    try:
        words = shlex.split(p.spec.srun_additional_args or "")
    except ValueError as exc:
        raise ConfigError(
            "SchedulingSpec.srun_additional_args", p.spec.srun_additional_args, str(exc)
        ) from None
    return words + list(p.options.srun_args)


def _q(word: object) -> str:
    return shlex.quote(str(word))


# ----------------------------------------------------------------- rendering --
def render_task_script(params: SbatchParams) -> str:
    """The bash script each srun task runs (``bash -c '<this>'``).

    It reads SLURM_PROCID, SLURM_LOCALID, SLURMD_NODENAME, CORRAL_INDEX_OFFSET and, if
    Slurm set it, CUDA_VISIBLE_DEVICES (the node's GPUs of this job); everything else is
    literal. It exports CORRAL_INDEX and CORRAL_NODE for the worker.
    Worker stdout+stderr go only to the three log files.
    """
    role = validate_role_name(params.role)
    log_dir = check_path("log_dir", params.log_dir)
    layout = params.layout()
    k = layout.nodes_per_worker
    gpus = layout.gpus_per_task
    restartable = params.spec.max_restarts > 0
    argv = _worker_argv(params)
    role_dir = _q(f"{log_dir.rstrip('/')}/{role}") if k == 1 else '"$corral_dir"'
    who = role if k == 1 else "${corral_role}"

    lines = ["set -u", "export PYTHONUNBUFFERED=1"]
    if k == 1:
        lines += [
            "corral_index=$(( ${CORRAL_INDEX_OFFSET:-0} + ${SLURM_PROCID:-0} ))",
            'export CORRAL_INDEX="$corral_index"',
        ]
    else:  # a multi-node instance: its worker, or a member (backends/slurm/members.py)
        lines += members.task_lines(role, log_dir, k, _q)
    # the worker's node, as Slurm names it (LOCAL_RANK counts the workers of one node)
    lines.append(f'export {E.NODE}="${{SLURMD_NODENAME:-$(hostname)}}"')
    if gpus > 0:
        # GPUs LOCALID*g .. LOCALID*g+g-1 of this node. When Slurm exported the job's
        # GPUs on this node (e.g. "2,3" on a node another job also uses), pick from
        # that list; otherwise the numbers themselves are the device ids.
        lines += [
            f"corral_gpus={gpus}",
            "corral_first=$(( ${SLURM_LOCALID:-0} * corral_gpus ))",
            'IFS=, read -r -a corral_alloc <<< "${CUDA_VISIBLE_DEVICES:-}"',
            'corral_devices=""',
            "for (( corral_i = corral_first; corral_i < corral_first + corral_gpus; corral_i++ )); do",
            "    if (( ${#corral_alloc[@]} >= corral_first + corral_gpus )); then",
            '        corral_devices+="${corral_devices:+,}${corral_alloc[corral_i]}"',
            "    else",
            '        corral_devices+="${corral_devices:+,}${corral_i}"',
            "    fi",
            "done",
        ]
        if restartable:
            # a replica restarted inside the allocation keeps the dead one's GPUs
            lines.append('corral_devices="${CORRAL_DEVICES:-$corral_devices}"')
        lines.append('export CUDA_VISIBLE_DEVICES="$corral_devices"')
        lines.append('export ASCEND_RT_VISIBLE_DEVICES="$corral_devices"')
    else:
        lines.append('export CUDA_VISIBLE_DEVICES=""  # CPU-only role: no GPU visible')
        lines.append('export ASCEND_RT_VISIBLE_DEVICES=""')
    lines += [
        f'corral_prefix="[{who}/${{corral_index}}] "',
        f"corral_log={role_dir}/${{corral_index}}.log",
        f"corral_exit={role_dir}/${{corral_index}}${{SLURM_JOB_ID:+.$SLURM_JOB_ID}}.exit",
        f"mkdir -p {role_dir}",
        # the job id may be one an earlier run used: none of its files speak for this job
        'rm -f "$corral_exit" "$corral_exit.pid" "$corral_exit.rc"',
    ]
    if restartable:  # where this replica runs, for a restart on the same node and GPUs
        lines.append(
            'printf "%s %s\\n" "${SLURMD_NODENAME:-$(hostname)}" "$CUDA_VISIBLE_DEVICES" > '
            f"{role_dir}/${{corral_index}}.place"
        )
    if k > 1:
        lines.append(members.node_line())
    for i, cmd in enumerate(params.spec.additional_bash_cmds):
        if not isinstance(cmd, str):
            raise ConfigError(f"SchedulingSpec.additional_bash_cmds[{i}]", cmd, "use a str")
        lines.append(cmd)
    # fd 3 feeds the role log through its own sed so that every line reaches both
    # shared logs in one append; the worker itself does not inherit fd 3.
    lines += [
        f'exec 3> >(sed -u "s|^|${{corral_prefix}}|" >> {_q(role_log_path(log_dir, role))})',
        "corral_sed=$!",
        # Slurm signals the task's main process (this bash) only: SIGTERM (scancel,
        # preemption, requeue, time limit) is passed on to the worker, which runs its
        # engines' on_preempt and exits cleanly while the log copiers drain its output.
        'corral_pidf="$corral_exit.pid"',
        """trap 'kill -TERM "$(cat "$corral_pidf" 2>/dev/null)" 2>/dev/null' TERM""",
        "{ "
        + " ".join(_q(a) for a in argv)
        + _contract_args(params)
        + ' 3>&- 2>&1 & printf "%s\\n" "$!" > "$corral_pidf"; wait "$!"; '
        + 'printf "%s\\n" "$?" > "$corral_exit.rc"; } \\',
        '    | tee -a "$corral_log" /dev/fd/3 \\',
        f'    | sed -u "s|^|${{corral_prefix}}|" >> {_q(merged_log_path(log_dir))} &',
        "corral_pipe=$!",
        'until wait "$corral_pipe"; do kill -0 "$corral_pipe" 2>/dev/null || break; done',
        'corral_rc=$(cat "$corral_exit.rc" 2>/dev/null || echo 1)',
        'rm -f "$corral_exit.rc" "$corral_pidf"',
        'printf "%s\\n" "$corral_rc" > "$corral_exit.tmp" && mv -f "$corral_exit.tmp" "$corral_exit"',
        "exec 3>&-",
        'wait "$corral_sed" 2>/dev/null || true',
        'exit "$corral_rc"',
    ]
    return "\n".join(lines) + "\n"


def render_sbatch_script(params: SbatchParams) -> str:
    """The whole batch script for ``sbatch``: directives, environment, one srun step."""
    p = params
    role = validate_role_name(p.role)
    p.options.checked()
    layout = p.layout()
    log_dir = check_path("log_dir", p.log_dir)
    job_name = directive_value("job_name", p.job_name)
    if (
        isinstance(p.index_offset, bool)
        or not isinstance(p.index_offset, int)
        or p.index_offset < 0
    ):
        raise ConfigError("index_offset", p.index_offset, "use a whole number >= 0")
    try:
        lease = float(p.lease_timeout)
    except (TypeError, ValueError):
        lease = -1.0
    if not lease > 0:
        raise ConfigError("lease_timeout", p.lease_timeout, "use a number of seconds > 0")
    if not isinstance(p.secret_file, str) or not p.secret_file:
        raise ConfigError("secret_file", p.secret_file, "give the path of the trial secret file")
    for name, value in (("experiment", p.experiment), ("trial", p.trial)):
        if not isinstance(value, str) or not value:
            raise ConfigError(name, value, "use a non-empty str")
    spec_env = check_env("SchedulingSpec.env_vars", p.spec.env_vars, allow_corral=False)
    extra_env = check_env("env", p.env, allow_corral=True)
    if extra_env.get(E.ROLE, role) != role:
        raise ConfigError(
            f"env[{E.ROLE!r}]", extra_env[E.ROLE], f"must match role={role!r} or be left out"
        )

    out = sbatch_log_path(log_dir, role)
    directives = [
        f"--job-name={job_name}",
        f"--output={out}",
        f"--error={out}",
        "--open-mode=append",
        f"--nodes={layout.nodes}",
        f"--ntasks={layout.ntasks}",
        f"--ntasks-per-node={layout.ntasks_per_node}",
        f"--cpus-per-task={layout.cpus_per_task}",
    ]
    if layout.mem_per_node_gb > 0:
        directives.append(f"--mem={layout.mem_per_node_gb}G")
    if layout.gpus_per_node > 0:
        directives.append(f"--gres=gpu:{layout.gpus_per_node}")
    directives.append("--requeue" if p.requeue else "--no-requeue")
    if p.signal is not None:
        if not isinstance(p.signal, str) or not SIGNAL_RE.match(p.signal):
            raise ConfigError(
                "signal", p.signal, 'use a Slurm --signal value such as "USR1@60" or "TERM@120"'
            )
        directives.append(f"--signal={p.signal}")
    o = p.options
    directives += slurm_directives(p.spec, o.partition)  # partition, constraint, ...
    for name, value in (("account", o.account), ("qos", o.qos)):
        if value is not None:
            directives.append(f"--{name}={value}")
    if o.time_limit is not None:
        directives.append(f"--time={o.time_limit}")
    nodelist = o.nodelist if o.nodelist is not None else p.spec.nodelist
    exclude = o.exclude if o.exclude is not None else p.spec.exclude
    if nodelist:
        directives.append(f"--nodelist={directive_value('nodelist', nodelist)}")
    if exclude:
        directives.append(f"--exclude={directive_value('exclude', exclude)}")
    directives += o.sbatch_directives

    ctype, image, mount = p.resolved_container()
    summary = (
        f"# corral role {role}: {p.replicas} replica(s) x (cpu={p.spec.cpu}, gpu={p.spec.gpu}, "
        f"mem={p.spec.mem}G) on {layout.nodes} node(s), container={ctype}"
    )
    # one export per name: corral's own values, then the caller's env (which may repeat
    # or override them, e.g. Scheduler.worker_env() without CORRAL_INDEX), then the
    # spec's env_vars (the user's word wins for everything that is not CORRAL_*)
    exports: dict[str, str] = {
        E.EXPERIMENT: _q(p.experiment),
        E.TRIAL: _q(p.trial),
        E.ROLE: _q(role),
        E.NAME_RESOLVE: _q(name_resolve_json(p.name_resolve)),
        E.SECRET_FILE: _q(p.secret_file),
        E.INDEX_OFFSET: str(p.index_offset),
        E.LEASE_TIMEOUT: repr(lease),
        E.PORT_COUNT: str(p.spec.port_count),
        E.LOG_DIR: _q(log_dir),
        E.BACKEND_ID: '"${SLURM_JOB_ID:-}"',
    }
    exports.update((k, _q(v)) for k, v in extra_env.items())
    exports.update((k, _q(v)) for k, v in spec_env.items())
    env_lines = [f"export {k}={v}" for k, v in exports.items()]

    srun = [
        "srun",
        f"--ntasks={layout.ntasks}",
        f"--ntasks-per-node={layout.ntasks_per_node}",
        f"--cpus-per-task={layout.cpus_per_task}",
        # fail fast: one failed task ends the step (and the job). A role that may restart
        # its workers keeps the others running when one dies (explicit 0, whatever the
        # site's KillOnBadExit says).
        "--kill-on-bad-exit=0" if p.spec.max_restarts > 0 else "--kill-on-bad-exit=1",
        "--unbuffered",
        *(_q(a) for a in _srun_extra(p)),
    ]
    task = render_task_script(p)
    parts = [
        "#!/bin/bash",
        *(f"#SBATCH {d}" for d in directives),
        summary,
        *(
            ["# image: " + str(image) + (f" (bind {mount})" if mount else "")]
            if ctype == "apptainer"
            else []
        ),
        "set -u",
        *env_lines,
        " ".join(srun) + " \\",
        f"    bash -c {_q(task)}",
    ]
    if p.spec.max_restarts > 0:
        # keep the allocation while the controller lives, so that a dead replica can be
        # restarted inside it (srun --jobid --overlap) even when the step above ended
        parts += [
            "corral_step_rc=$?",
            f"{_q(p.python or 'python3')} -m corral.worker.hold || true",
            'exit "$corral_step_rc"',
        ]
    return "\n".join(parts) + "\n"
