"""The ``corral`` command: demo, run, ps, logs, stop."""

from __future__ import annotations

import argparse
import codecs
import json
import os
import sys
import time
from typing import TYPE_CHECKING

from corral import name_resolve_keys
from corral.backends import backend_names
from corral.cli_errors import debug_wanted, report
from corral.cli_trials import pick_log_trial, require_trial
from corral.config import ClusterSpecConfig
from corral.controller.run_lease import Lease
from corral.discovery import FileNameResolve, NameResolve, make_name_resolve
from corral.errors import ConfigError
from corral.observe import inert
from corral.paths import TrialPaths, records_root, secret_file

if TYPE_CHECKING:
    from corral.rpc.client import RPCClient


def _name_resolve(args: argparse.Namespace) -> NameResolve:
    if args.etcd:
        return make_name_resolve({"type": "etcd3", "etcd3_addr": args.etcd})
    return FileNameResolve(records_root(args.fileroot))


def _secret(fileroot: str, experiment: str, trial: str) -> str | None:
    try:
        with open(secret_file(fileroot, experiment, trial)) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _verified(nr: NameResolve, secret: str | None, key: str) -> str | None:
    """A record's value, only if it is signed with the trial's secret (a forged record
    is reported and never contacted)."""
    from corral.discovery.signed import SignedNameResolve

    if not secret:
        return None
    try:
        return SignedNameResolve(nr, secret).get(key)
    except Exception as exc:
        print(inert.text(f"{key}: {exc}"), file=sys.stderr)
        return None


def _address(nr: NameResolve, secret: str | None, exp: str, trial: str, wid: str) -> str | None:
    role, _, index = wid.partition("/")
    return _verified(nr, secret, name_resolve_keys.worker_address_key(exp, trial, role, int(index)))


def _trials(nr: NameResolve) -> dict[tuple[str, str], dict[str, str]]:
    """(experiment, trial) -> {role/index: address}, from name-resolve entries."""
    found: dict[tuple[str, str], dict[str, str]] = {}
    for key in nr.get_all():
        parts = key.split("/")
        if len(parts) == 4 and not parts[2].startswith("_") and parts[3].isdigit():
            found.setdefault((parts[0], parts[1]), {})[f"{parts[2]}/{parts[3]}"] = "?"
        elif (len(parts) == 3 and parts[2] == "_controller") or (
            len(parts) == 5 and parts[2] == "_health"
        ):
            found.setdefault((parts[0], parts[1]), {})
    return found


def cmd_ps(args: argparse.Namespace) -> int:
    from corral.rpc.client import RPCClient

    nr = _name_resolve(args)
    trials = _trials(nr)
    if not trials:
        print(f"no experiments found in {args.etcd or records_root(args.fileroot)}")
        return 0
    print(f"{'EXPERIMENT':<16} {'TRIAL':<24} {'WORKER':<16} {'ADDRESS':<22} {'PID':>7}  HEALTH")
    for (exp, trial), workers in sorted(trials.items()):
        secret = _secret(args.fileroot, exp, trial) if _safe_name(exp, trial) else None
        client = RPCClient(secret) if secret else None
        lease = Lease.parse(_verified(nr, secret, name_resolve_keys.controller_key(exp, trial)))
        if lease is None and nr.get(name_resolve_keys.controller_key(exp, trial)) is not None:
            _print_inert(f"{exp:<16} {trial:<24} {'(controller)':<16} lease record not verified")
        if lease is not None:
            alive = "alive" if lease.alive(5.0) else "NOT RENEWED"
            _print_inert(f"{exp:<16} {trial:<24} {'(controller)':<16} {lease.describe()}: {alive}")
        deaths = _deaths(nr, exp, trial, secret)
        for wid in deaths:
            workers.setdefault(wid, "-")
        if not workers and lease is None:
            _print_inert(f"{exp:<16} {trial:<24} {'-':<16} {'(no workers)':<22}")
        for wid, address in sorted(
            workers.items(), key=lambda kv: (kv[0].split("/")[0], int(kv[0].split("/")[1]))
        ):
            role, index = wid.split("/")
            if address != "-":
                address = _address(nr, secret, exp, trial, wid) or "?"
            raw = _verified(
                nr, secret, name_resolve_keys.worker_info_key(exp, trial, role, int(index))
            )
            pid = json.loads(raw).get("pid", "") if raw else ""
            health = "no secret" if secret is None else "record not verified"
            if wid in deaths:
                health = f"dead ({deaths[wid]})"
            elif client is not None and address not in ("-", "?"):
                health = _probe(client, address)
            _print_inert(f"{exp:<16} {trial:<24} {wid:<16} {address:<22} {pid!s:>7}  {health}")
    return 0


def _probe(client: RPCClient, address: str, attempts: int = 2) -> str:
    """The worker's health status; a busy host gets a second, longer chance."""
    for attempt in range(attempts):
        try:
            return client.request(address, "/health", method="GET", timeout=3.0 * (attempt + 1))[
                "status"
            ]
        except Exception as exc:
            why = f"unreachable ({type(exc).__name__}: {exc})"
    return why


def _deaths(nr: NameResolve, experiment: str, trial: str, secret: str | None) -> dict[str, str]:
    """``role/index`` -> why, for deaths the controller's health monitor recorded (only
    notes signed with the trial's secret; others are reported as forged)."""
    found = {}
    for key in nr.get_subtree(f"{experiment}/{trial}/_health"):
        parts = key.split("/")
        if len(parts) != 5 or not parts[4].isdigit():
            continue
        raw = _verified(nr, secret, key)
        try:
            record = json.loads(raw) if raw else None
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("state") == "dead":
            found[f"{parts[3]}/{parts[4]}"] = inert.text(record.get("reason", "?"))
    return found


def _print_inert(*values: object, **kwargs) -> None:
    """``print`` for lines made of strings read from records: control characters escaped."""
    print(*(inert.text(v) for v in values), **kwargs)


def _safe_name(*names: str) -> bool:
    """Names read from a store, before they become a path: no separators, not dots."""
    return all(n and "/" not in n and "\0" not in n and n not in (".", "..") for n in names)


def _latest_trial(log_root: str) -> tuple[str, str] | None:
    best = None
    if not os.path.isdir(log_root):
        return None
    for exp in os.listdir(log_root):
        for trial in os.listdir(os.path.join(log_root, exp)):
            mtime = os.path.getmtime(os.path.join(log_root, exp, trial))
            if best is None or mtime > best[0]:
                best = (mtime, exp, trial)
    return (best[1], best[2]) if best else None


def cmd_logs(args: argparse.Namespace) -> int:
    exp, trial = pick_log_trial(args.fileroot, args.experiment, args.trial)
    paths = TrialPaths.of(args.fileroot, exp, trial)
    role, _, index = args.target.partition("/")
    if index and not index.isdigit():
        raise ConfigError("target", args.target, "give ROLE, ROLE/INDEX (a number) or merged")
    if role in ("", "all", "merged"):
        path = paths.merged_log()
    elif index:
        path = paths.replica_log(role, int(index))
    else:
        path = paths.role_log(role)
    if not os.path.exists(path):
        print(f"corral logs: no log of {args.target} in {exp}/{trial} ({path})", file=sys.stderr)
        return 1
    print(f"corral logs: {exp}/{trial} {args.target} ({path})", file=sys.stderr, flush=True)
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    with open(path, "rb") as fh:  # engine output, shown inert: no escape sequence passes
        sys.stdout.write(inert.lines(decoder.decode(fh.read())))
        sys.stdout.flush()
        while args.follow:
            chunk = fh.read()
            if chunk:
                sys.stdout.write(inert.lines(decoder.decode(chunk)))
                sys.stdout.flush()
            else:
                time.sleep(0.2)
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    from corral.rpc.client import RPCClient

    nr = _name_resolve(args)
    registered = _trials(nr)
    require_trial(args.fileroot, args.experiment, args.trial, set(registered))
    workers = registered.get((args.experiment, args.trial), {})
    secret = _secret(args.fileroot, args.experiment, args.trial)
    stopped = 0
    if secret:
        client = RPCClient(secret)
        for wid in workers:
            address = _address(nr, secret, args.experiment, args.trial, wid)
            if address is None:
                continue
            try:
                client.request(address, "/shutdown", {}, timeout=5.0)
                stopped += 1
                print(f"asked {wid} at {address} to stop")
            except Exception as exc:
                print(f"{wid} at {address}: {type(exc).__name__}: {exc}")
    nr.delete(name_resolve_keys.controller_key(args.experiment, args.trial))
    from corral.backends import stop_trial_leftovers

    for line in stop_trial_leftovers(args.experiment, args.trial):
        print(line)
    print(
        f"removed the controller lease of {args.experiment}/{args.trial}; {stopped} worker(s) told to stop, "
        "the rest exit within the lease timeout"
    )
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    from corral.errors import ConfigError
    from corral.observe.dashboard import run_dashboard
    from corral.observe.source import TrialSource

    if bool(args.experiment) != bool(args.trial):
        print("corral dashboard: give both EXPERIMENT and TRIAL, or neither", file=sys.stderr)
        return 2
    if args.trial:
        require_trial(args.fileroot, args.experiment, args.trial, set(_trials(_name_resolve(args))))
    try:
        run_dashboard(
            TrialSource(
                args.fileroot, args.experiment, args.trial, args.max_age, _name_resolve(args)
            ),
            host=args.host,
            port=args.port,
            print_fn=lambda text: print(text, flush=True),
        )
    except ConfigError as exc:
        print(f"corral dashboard: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_top(args: argparse.Namespace) -> int:
    from corral.observe.source import TrialSource
    from corral.observe.top import run_top

    if bool(args.experiment) != bool(args.trial):
        print("corral top: give both EXPERIMENT and TRIAL, or neither", file=sys.stderr)
        return 2
    source = TrialSource(
        args.fileroot, args.experiment, args.trial, args.max_age, _name_resolve(args)
    )
    if args.trial:
        require_trial(args.fileroot, args.experiment, args.trial, set(_trials(source.name_resolve)))
    if args.interval <= 0 or (args.count is not None and args.count < 1):
        print("corral top: use --interval > 0 and --count >= 1", file=sys.stderr)
        return 2
    return run_top(source, once=args.once, interval=args.interval, count=args.count)


def cmd_demo(args: argparse.Namespace) -> int:
    from corral.demo.run import run_demo

    for item in args.override:
        if "=" not in item:
            raise ConfigError(
                "override", item, "write it as a dotted key=value, e.g. scheduler.type=ray"
            )
    overrides = dict(o.split("=", 1) for o in args.override)
    scheduler = overrides.pop("scheduler.type", args.scheduler)
    if scheduler not in backend_names():
        raise ConfigError("scheduler.type", scheduler, f"use one of {', '.join(backend_names())}")
    run_demo(
        scheduler_type=scheduler,
        steps=args.steps,
        fileroot=args.fileroot,
        rollout_replicas=args.rollout,
        trainer_replicas=args.trainers,
        use_torch=False if args.no_torch else None,
        overrides=overrides,
        verbose=args.verbose,
    )
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from corral.config import BaseExperimentConfig, load_expr_config, make_scheduler

    cfg, _ = load_expr_config(args.config, BaseExperimentConfig)
    if args.dry_run:  # the backend cfg.scheduler.type names; starts and writes nothing
        from corral.controller.dryrun import job_of

        with make_scheduler(cfg, dry_run=True) as sched:
            print(sched.dry_run(job_of(cfg, args.role, args.replicas)))
        if cfg.extra:
            print(f"not corral's, kept in cfg.extra and ignored: {', '.join(sorted(cfg.extra))}")
        return 0
    print("corral run without --dry-run: use the Python API (see README)", file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    default_root = os.environ.get("CORRAL_FILEROOT", ClusterSpecConfig().fileroot)
    parser = argparse.ArgumentParser(prog="corral", description=__doc__)
    parser.add_argument(
        "--fileroot", default=default_root, help="cluster fileroot (default %(default)s)"
    )
    parser.add_argument("--etcd", default=None, help="etcd host:port, if name-resolve is etcd")
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error (or CORRAL_DEBUG=1)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the demo RL job")
    demo.add_argument("--scheduler", default="local", choices=list(backend_names()))
    demo.add_argument("--steps", type=int, default=30)
    demo.add_argument("--rollout", type=int, default=2)
    demo.add_argument("--trainers", type=int, default=2)
    demo.add_argument(
        "--no-torch", action="store_true", help="learners average gradients with numpy"
    )
    demo.add_argument(
        "--verbose", action="store_true", help="also show the backend's own log lines (Ray)"
    )
    demo.add_argument("override", nargs="*", help="dotted overrides such as scheduler.type=ray")
    demo.set_defaults(fn=cmd_demo)

    ps = sub.add_parser("ps", help="experiments and workers in name-resolve, with health")
    ps.set_defaults(fn=cmd_ps)

    logs = sub.add_parser("logs", help="print a role's, a replica's or the merged log")
    logs.add_argument("target", nargs="?", default="merged", help="ROLE, ROLE/INDEX or merged")
    logs.add_argument("-f", "--follow", action="store_true")
    logs.add_argument("--experiment")
    logs.add_argument("--trial")
    logs.set_defaults(fn=cmd_logs)

    stop = sub.add_parser("stop", help="stop every worker of a trial")
    stop.add_argument("experiment")
    stop.add_argument("trial")
    stop.set_defaults(fn=cmd_stop)

    dash = sub.add_parser("dashboard", help="a live web view of the trials (docs/dashboard.md)")
    dash.add_argument("experiment", nargs="?", help="show only this experiment's TRIAL")
    dash.add_argument("trial", nargs="?")
    dash.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default %(default)s)"
    )
    dash.add_argument(
        "--port", type=int, default=8470, help="0: any free port (default %(default)s)"
    )
    dash.add_argument(
        "--max-age", type=float, default=3600.0, help="hide trials silent for longer (seconds)"
    )
    dash.set_defaults(fn=cmd_dashboard)

    top = sub.add_parser("top", help="the live table of workers in the terminal")
    top.add_argument("experiment", nargs="?")
    top.add_argument("trial", nargs="?")
    top.add_argument("--once", action="store_true", help="print the table once and exit")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    top.add_argument("--count", type=int, default=None, help="stop after this many refreshes")
    top.add_argument(
        "--max-age", type=float, default=3600.0, help="hide trials silent for longer (seconds)"
    )
    top.set_defaults(fn=cmd_top)

    run = sub.add_parser(
        "run",
        help="show what a role's launch would ask the backend (scheduler.type) for (--dry-run)",
    )
    run.add_argument("config", nargs="+", help="YAML file and dotted overrides")
    run.add_argument("--role", default="worker")
    run.add_argument("--replicas", type=int, default=1)
    run.add_argument("--dry-run", action="store_true")
    run.set_defaults(fn=cmd_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one or two lines, not a traceback (cli_errors)
        if debug_wanted(args.debug):
            raise
        return report(args.command, exc, lambda line: print(line, file=sys.stderr))


if __name__ == "__main__":
    sys.exit(main())
