"""Without AReaL loaded, corral's errors are exactly corral's classes and AReaL is never
imported (AReaL-style ``except`` clauses with AReaL loaded:
tests/areal_compat/test_areal_except.py)."""

from __future__ import annotations

import subprocess
import sys

WITHOUT_AREAL = """
import inspect, sys
import corral
from corral import errors
from corral import LocalScheduler

sched = LocalScheduler(gpu_devices=[], experiment_name="twins", trial_name="t1",
                       fileroot=sys.argv[1])
try:
    sched.call_engine("ghost/0", "noop")
except errors.WorkerNotFoundError as exc:
    assert type(exc) is errors.WorkerNotFoundError, type(exc)
finally:
    sched.close()
samples = {
    errors.WorkerFailedError: ("w/0", 3, "tail"),
    errors.EngineCallError: ("w/0", "m", "r", 2),
    errors.WorkerTimeoutError: ("w/0", 5.0),
    errors.UnknownRoleError: ("target", "x", "fix"),
    errors.GPURequestError: ("gpu", 9, "fix"),
}
for cls in samples:
    exc = cls(*samples[cls])
    assert type(exc) is cls, (cls, type(exc).__mro__)
assert str(errors.WorkerTimeoutError("w/0", 5.0)) == "worker 'w/0' not ready after 5.0s"
print(sorted(m for m in sys.modules if m == "areal" or m.startswith("areal.")))
"""


def test_without_areal_loaded_errors_are_corrals_classes_and_areal_is_not_imported(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_AREAL, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"
