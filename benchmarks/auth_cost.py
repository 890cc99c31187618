"""What signing every request and reply costs: corral now vs corral before signing.

Runs the same two measurements with two source trees, alternating A/B rounds so both see
the same machine noise, and reports medians and ratios (now / before):

* noop ``call_engine`` latency, p50 and p99 (sync client, one local worker)
* round trip of a 128 MiB float32 array (``echo``), in GB/s (bytes sent + received),
  through same-host shared memory (the default here: the segment descriptor is signed,
  the bytes are not hashed) and over the socket (``CORRAL_SHM=0``: the body digest,
  AES-GMAC for bodies of 1 MiB or more, is computed and checked on both sides)

Two baselines, measured in the same run:

* ``unsigned``: today's tree with the signing stubbed out (``auth.py`` of a copy patched
  so that signatures and body digests are constants and the replay guard accepts all):
  the cost of signing alone, everything else identical.
* ``before``: ``git archive <ref> src/corral`` of ``--baseline-ref`` (default: the last
  commit before signed requests, where the secret was a bearer header). Other changes
  landed since then too, so this ratio is "today vs then", not signing alone.

Usage::

    python benchmarks/auth_cost.py [--rounds 3] [--baseline-ref REF]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRE_SIGNING = "24e69e1"  # main just before signed requests landed (bearer secret header)


def measure(noop_calls: int, payload_reps: int) -> dict:
    """Run inside a child process whose PYTHONPATH selects the tree under test."""
    import numpy as np

    import corral
    from corral import BaseExperimentConfig, Job
    from corral.backends.local import LocalScheduler

    root = tempfile.mkdtemp(prefix="corral-authbench-")
    cfg = BaseExperimentConfig(experiment_name="authbench", trial_name=f"t{os.getpid()}")
    sched = LocalScheduler(exp_config=cfg, fileroot=root, gpu_devices=[])
    try:
        (wid,) = sched.create_workers(Job(role="b", replicas=1))
        import asyncio

        asyncio.run(sched.create_engine(wid, "corral.testing.engines.EchoEngine", "e"))
        for _ in range(200):
            sched.call_engine(wid, "noop", "e")
        times = []
        for _ in range(noop_calls):
            t0 = time.perf_counter()
            sched.call_engine(wid, "noop", "e")
            times.append(time.perf_counter() - t0)
        times.sort()
        arr = np.ones(128 << 18, dtype=np.float32)  # 128 MiB
        sched.call_engine(wid, "echo", "e", arr)
        rates = []
        for _ in range(payload_reps):
            t0 = time.perf_counter()
            out = sched.call_engine(wid, "echo", "e", arr)
            rates.append(2 * arr.nbytes / (time.perf_counter() - t0) / 1e9)
            del out
        return {
            "corral": os.path.dirname(corral.__file__),
            "noop_p50_ms": times[len(times) // 2] * 1e3,
            "noop_p99_ms": times[int(len(times) * 0.99)] * 1e3,
            "f32_128MiB_gbps": statistics.median(rates),
        }
    finally:
        sched.close()


def _tree(ref: str, into: str) -> str:
    tar = os.path.join(into, "src.tar")
    with open(tar, "wb") as fh:
        subprocess.run(["git", "-C", REPO, "archive", ref, "src/corral"], stdout=fh, check=True)
    with tarfile.open(tar) as tf:
        tf.extractall(into, filter="data")
    return os.path.join(into, "src")


_UNSIGNED = """

# --- benchmarks/auth_cost.py: the "unsigned" baseline, signing stubbed out ---
TrialKeys.sign = lambda self, key, fields: "0"
TrialKeys.body_digest = lambda self, parts, length: "none"
TrialKeys.body_matches = lambda self, digest, body: True
ReplayGuard.check = lambda self, nonce, ts: None
"""


def _unsigned_tree(into: str) -> str:
    """A copy of today's ``src/corral`` whose requests and replies are not signed."""
    import shutil

    src = os.path.join(into, "unsigned", "src")
    shutil.copytree(os.path.join(REPO, "src", "corral"), os.path.join(src, "corral"),
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    with open(os.path.join(src, "corral", "auth.py"), "a") as fh:
        fh.write(_UNSIGNED)
    return src


def _run(src: str, args: argparse.Namespace) -> dict:
    shm = _run_child(src, args.noop_calls, args.payload_reps, {})
    sock = _run_child(src, 200, args.payload_reps, {"CORRAL_SHM": "0"})
    return {**shm, "f32_128MiB_socket_gbps": sock["f32_128MiB_gbps"]}


def _run_child(src: str, noop_calls: int, payload_reps: int, extra: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": src, **extra}
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(noop_calls), str(payload_reps)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline-ref", default=PRE_SIGNING)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--noop-calls", type=int, default=2000)
    parser.add_argument("--payload-reps", type=int, default=5)
    parser.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child)))
        return 0
    now_src = os.path.join(REPO, "src")
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"before": _tree(args.baseline_ref, tmp), "unsigned": _unsigned_tree(tmp),
                 "now": now_src}  # fmt: skip
        results: dict[str, list[dict]] = {name: [] for name in trees}
        for i in range(args.rounds):
            for name, src in trees.items():
                results[name].append(_run(src, args))
                print(f"round {i + 1} {name}: {results[name][-1]}", file=sys.stderr)
    print(f"load average at the end: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    print(f"| metric | before signing ({args.baseline_ref}) | today, unsigned | today, signed "
          "| cost vs unsigned | cost vs before |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for key, better in (("noop_p50_ms", "lower"), ("noop_p99_ms", "lower"),
                        ("f32_128MiB_gbps", "higher"),
                        ("f32_128MiB_socket_gbps", "higher")):  # fmt: skip
        med = {name: statistics.median(r[key] for r in results[name]) for name in trees}

        def cost(base: str, key=key, better=better, med=med) -> float:
            return med["now"] / med[base] if better == "lower" else med[base] / med["now"]

        print(f"| {key} | {med['before']:.3f} | {med['unsigned']:.3f} | {med['now']:.3f} "
              f"| {cost('unsigned'):.2f}x | {cost('before'):.2f}x |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
