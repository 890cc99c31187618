"""Run corral's benchmarks next to the machine's own limits and write the results.

    python benchmarks/run.py [--quick] [--backends local,ray,slurm] [--out benchmarks/results]

Each backend is a module ``bench_<name>.py`` in this folder, registered in ``BACKENDS``,
with ``check() -> str | None`` (why it cannot run here, or None),
``run(ctx: common.Context) -> list[common.Row]`` (raise ``common.BackendUnavailable`` when
it cannot run) and optionally ``NEEDS``: backends whose rows it uses as baselines, which
then run first. Rows measured earlier are available to later backends through
``ctx.row(key)`` (the Ray rows use the local figures as baselines).

Everything runs under a fresh fileroot in /tmp with unique experiment names, and every
worker, server and scratch file is cleaned up on exit, error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import common  # noqa: E402
import report  # noqa: E402
from common import BackendUnavailable, Context, Row, log, machine_info  # noqa: E402

# name -> module in this folder. Add a backend by writing bench_<name>.py and a line here.
BACKENDS = {
    "local": "bench_local",
    "ray": "bench_ray",
    "slurm": "bench_slurm",
    "scale": "bench_scale",
    "data": "bench_data",
    "netns": "bench_netns",  # root only: stand-in hosts with rate-limited links
    "verbs": "bench_verbs",  # dispatch over a role, weight sync (issue 23)
    "verbs_netns": "bench_verbs_netns",  # root only: weight sync over 1 Gbit/s links
    "grpo": "bench_grpo",  # examples/grpo_tiny: corral's share of a real RL step
    "shapes": "bench_shapes",  # grouped colocation and multi-node instances, Ray + Slurm
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer iterations, N <= 8 (under a minute)"
    )
    parser.add_argument(
        "--backends",
        default="local",
        help=f"comma-separated, run in this order (known: {', '.join(BACKENDS)})",
    )
    parser.add_argument(
        "--out",
        default=os.path.join(HERE, "results"),
        help="folder for latest.json and latest.md (default: benchmarks/results)",
    )
    args = parser.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in args.backends if b not in BACKENDS]
    if unknown or not args.backends:
        parser.error(f"unknown backend(s) {unknown}; use some of {', '.join(BACKENDS)}")
    return args


def resolve_order(names: list[str]) -> list[str]:
    """The backends to run: each one's ``NEEDS`` first, then itself, each once."""
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in order:
            return
        if name in path:
            raise SystemExit(f"benchmark backends need each other: {' -> '.join(path)}")
        for need in getattr(importlib.import_module(BACKENDS[name]), "NEEDS", []):
            visit(need, (*path, name))
        order.append(name)

    for name in names:
        visit(name, ())
    return order


def _sigterm(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.backends = resolve_order(args.backends)
    signal.signal(signal.SIGTERM, _sigterm)
    common.ensure_corral_bytecode()  # workers read it, as from an installed package
    ctx = Context(quick=args.quick, repo=REPO)
    doc = {
        "schema": 1,
        "options": {"quick": args.quick, "backends": args.backends},
        "machine": machine_info(REPO),
        "fileroot": ctx.fileroot,
        "skipped": {},
        "failed": {},
        "durations_s": {},
    }
    log(f"{'quick' if args.quick else 'full'} run of {', '.join(args.backends)}; {ctx.fileroot}")
    started = time.perf_counter()
    try:
        for name in args.backends:
            t0 = time.perf_counter()
            try:
                module = importlib.import_module(BACKENDS[name])
                rows: list[Row] = module.run(ctx)
            except BackendUnavailable as exc:
                log(f"{name}: not available: {exc}")
                doc["skipped"][name] = str(exc)
                continue
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                log(f"{name}: failed:\n{traceback.format_exc()}")
                doc["failed"][name] = f"{type(exc).__name__}: {exc}"
                continue
            finally:
                doc["durations_s"][name] = round(time.perf_counter() - t0, 2)
            ctx.rows += [r.finish() for r in rows]
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
        ctx.close()
        doc["interrupted"] = True
        doc["durations_s"]["total"] = round(time.perf_counter() - started, 2)
        json_path, md_path = report.write(args.out, doc, ctx.rows, name="interrupted")
        log(f"the rows measured before the interrupt: {md_path} (latest.md is unchanged)")
        return 130
    finally:
        ctx.close()
    doc["durations_s"]["total"] = round(time.perf_counter() - started, 2)
    try:
        doc["machine"]["loadavg_at_end"] = list(os.getloadavg())
    except OSError:
        pass
    json_path, md_path = report.write(args.out, doc, ctx.rows)
    print(report.markdown(report._finite(doc), ctx.rows))
    log(f"wrote {json_path} and {md_path}")
    return 1 if doc["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
