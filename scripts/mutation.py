"""Mutation check: put curated one-line bugs back, one at a time, and see the tests fail.

Each mutant (scripts/mutants.py) names a file under src/corral, a snippet of code that must
occur exactly once there, its replacement, and the tests that should catch it. The driver
copies the working tree to a temporary directory once, applies each mutant to that copy
only (never to the tree it was started from), runs the named tests against the copy
(PYTHONPATH points at it, so worker processes, Ray actors and Slurm jobs load the mutant
too), restores the file, and prints the mutant with CAUGHT, SURVIVED or STALE (the snippet
is gone or ambiguous, e.g. after a refactor: update it in scripts/mutants.py).

    bash scripts/mutation.sh                      # every mutant
    bash scripts/mutation.sh --backend local      # only mutants whose tests are local
    bash scripts/mutation.sh --only rpc-retry-new-id,local-cuda-off-by-one
    bash scripts/mutation.sh --list               # list, run nothing

Ray and Slurm mutants run under the same locks as their tests (/tmp/corral-ray.lock,
/tmp/corral-slurm.lock); Slurm jobs left by a mutant's run are cancelled afterwards.
Exit status: 0 when every selected mutant was caught and none is stale, else 1.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from mutants import MUTANTS, Mutant  # noqa: E402

LOCKS = {"ray": "/tmp/corral-ray.lock", "slurm": "/tmp/corral-slurm.lock"}
CAUGHT_CODES = {1, 2, 3}  # tests failed, interrupted (collection error), internal error


@dataclass
class Outcome:
    mutant: Mutant
    verdict: str  # CAUGHT, SURVIVED, STALE, ERROR, BASELINE-FAILED
    detail: str = ""
    seconds: float = 0.0


def repo_root() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--show-toplevel"], cwd=HERE, capture_output=True, text=True
    ).stdout.strip()


def copy_tree(root: str, dest: str) -> None:
    """Tracked and untracked-but-not-ignored files of ``root`` into ``dest``."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for rel in filter(None, files):
        src = os.path.join(root, rel)
        if not os.path.isfile(src) or os.path.islink(src):
            continue
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(src, target)


def locate(text: str, snippet: str) -> str | None:
    """None if ``snippet`` occurs exactly once in ``text``, else why not."""
    count = text.count(snippet)
    if count == 1:
        return None
    return "snippet not found" if count == 0 else f"snippet occurs {count} times"


@contextlib.contextmanager
def backend_lock(backend: str):
    path = LOCKS.get(backend)
    if path is None:
        yield
        return
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        before = slurm_jobs() if backend == "slurm" else set()
        try:
            yield
        finally:
            if backend == "slurm":
                left = sorted(slurm_jobs() - before)
                if left:
                    subprocess.run(["scancel", *left], capture_output=True)
                    print(f"    (cancelled Slurm jobs left by the run: {' '.join(left)})")
            fcntl.flock(fh, fcntl.LOCK_UN)


def slurm_jobs() -> set[str]:
    try:
        out = subprocess.run(
            ["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return set(out.split())


def run_tests(copy: str, mutant: Mutant, timeout: float) -> tuple[int | None, str]:
    """(pytest exit code or None on timeout, last lines of its output)."""
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.path.join(copy, "src"),
        PYTHONDONTWRITEBYTECODE="1",
        CORRAL_TEST_BACKENDS=mutant.backend,
    )
    conf = "/tmp/corral-slurm/etc/slurm.conf"
    if mutant.backend == "slurm" and "SLURM_CONF" not in env and os.path.exists(conf):
        env["SLURM_CONF"] = conf
    argv = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
    argv += shlex.split(mutant.tests)
    proc = subprocess.Popen(
        argv,
        cwd=copy,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        code = None
    except BaseException:  # interrupted: take the test run down with us
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    lines = [ln for ln in out.splitlines() if ln.strip()]
    return code, "\n".join(lines[-3:])


def run_one(copy: str, mutant: Mutant, timeout: float) -> Outcome:
    path = os.path.join(copy, "src", "corral", mutant.file)
    try:
        original = open(path).read()
    except FileNotFoundError:
        return Outcome(mutant, "STALE", f"file src/corral/{mutant.file} not found")
    why = locate(original, mutant.find)
    if why:
        return Outcome(mutant, "STALE", f"{why} in src/corral/{mutant.file}: {mutant.find!r}")
    started = time.monotonic()
    try:
        with open(path, "w") as fh:
            fh.write(original.replace(mutant.find, mutant.replace))
        with backend_lock(mutant.backend):
            code, tail = run_tests(copy, mutant, timeout)
    finally:
        with open(path, "w") as fh:
            fh.write(original)
    seconds = time.monotonic() - started
    if code is None:
        return Outcome(mutant, "CAUGHT", f"tests hung past {timeout:.0f}s", seconds)
    if code in CAUGHT_CODES:
        failed = [ln for ln in tail.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        return Outcome(mutant, "CAUGHT", (failed or tail.splitlines()[-1:] or [""])[0], seconds)
    if code == 0:
        return Outcome(mutant, "SURVIVED", "all selected tests passed", seconds)
    return Outcome(mutant, "ERROR", f"pytest exit {code}: {tail}", seconds)


def baseline(copy: str, mutants: list[Mutant], timeout: float) -> dict[tuple[str, str], str]:
    """Run each distinct test selection once unmutated; map the failing ones to why."""
    failed = {}
    for key in sorted({(m.tests, m.backend) for m in mutants}):
        probe = Mutant("baseline", "", "", "", tests=key[0], backend=key[1])
        with backend_lock(key[1]):
            code, tail = run_tests(copy, probe, timeout)
        state = "ok" if code == 0 else f"exit {code}: {tail}"
        print(f"  baseline [{key[1]}] {key[0]}: {state}", flush=True)
        if code != 0:
            failed[key] = state
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated mutant ids")
    ap.add_argument("--backend", choices=["local", "ray", "slurm"], help="only these mutants")
    ap.add_argument("--module", help="only mutants of files under this prefix, e.g. rpc/")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--check", action="store_true", help="only check every snippet exists")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated runs")
    ap.add_argument("--timeout", type=float, default=420.0, help="seconds per test run")
    ap.add_argument("--markdown", help="also write the results as a Markdown table here")
    args = ap.parse_args(argv)
    # SIGTERM (and SIGINT, which background shells ignore) unwind through the finally
    # blocks: the mutated file is restored and the temporary copy removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    chosen = list(MUTANTS)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {m.id for m in MUTANTS}
        if unknown:
            ap.error(f"unknown mutant id(s): {', '.join(sorted(unknown))}")
        chosen = [m for m in chosen if m.id in wanted]
    if args.backend:
        chosen = [m for m in chosen if m.backend == args.backend]
    if args.module:
        chosen = [m for m in chosen if m.file.startswith(args.module)]
    if args.list:
        for m in chosen:
            print(f"{m.id:34} {m.backend:5} {m.file:22} {m.why}")
        return 0

    root = repo_root()
    if args.check:
        return check_snippets(root, chosen)
    copy = tempfile.mkdtemp(prefix="corral-mutation-")
    results: list[Outcome] = []
    try:
        copy_tree(root, copy)
        print(f"{len(chosen)} mutant(s); tree copied to {copy}", flush=True)
        broken = {} if args.no_baseline else baseline(copy, chosen, args.timeout)
        for i, m in enumerate(chosen, 1):
            if (m.tests, m.backend) in broken:
                out = Outcome(m, "BASELINE-FAILED", broken[(m.tests, m.backend)])
            else:
                out = run_one(copy, m, args.timeout)
            results.append(out)
            print(
                f"[{i:2}/{len(chosen)}] {out.verdict:8} {m.id} ({m.backend}, {m.file}, "
                f"{out.seconds:.0f}s)\n    mutant: {m.why}\n    {out.detail}",
                flush=True,
            )
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    if args.markdown:
        write_markdown(args.markdown, results)
    return report(results)


def write_markdown(path: str, results: list[Outcome]) -> None:
    """One row per mutant: id, backend, file, the bug, the verdict and the failing test."""
    rows = ["| mutant | backend | file | bug put back | verdict | first failing test |"]
    rows.append("|---|---|---|---|---|---|")
    for r in results:
        detail = r.detail.removeprefix("FAILED ").split(" - ")[0].replace("|", "\\|")
        m = r.mutant
        rows.append(f"| `{m.id}` | {m.backend} | {m.file} | {m.why} | {r.verdict} | {detail} |")
    with open(path, "w") as fh:
        fh.write("\n".join(rows) + "\n")


def check_snippets(root: str, mutants: list[Mutant]) -> int:
    """Print each mutant whose snippet is gone or ambiguous; 1 if any is."""
    stale = 0
    for m in mutants:
        path = os.path.join(root, "src", "corral", m.file)
        why = locate(open(path).read(), m.find) if os.path.exists(path) else "file not found"
        if why:
            stale += 1
            print(f"STALE {m.id}: {why} in src/corral/{m.file}: {m.find!r}")
    print(f"{len(mutants) - stale} of {len(mutants)} snippets found exactly once")
    return 1 if stale else 0


def report(results: list[Outcome]) -> int:
    counted = [r for r in results if r.verdict in ("CAUGHT", "SURVIVED")]
    caught = [r for r in counted if r.verdict == "CAUGHT"]
    rate = 100.0 * len(caught) / len(counted) if counted else 0.0
    print(f"\ncaught {len(caught)} of {len(counted)} mutants ({rate:.0f}%)")
    for verdict in ("SURVIVED", "STALE", "ERROR", "BASELINE-FAILED"):
        for r in results:
            if r.verdict == verdict:
                print(f"  {verdict}: {r.mutant.id} ({r.mutant.file}): {r.detail}")
    ok = len(caught) == len(results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
