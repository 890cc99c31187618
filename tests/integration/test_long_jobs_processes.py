"""Long-job pieces that need a real process or Slurm tool: adopted processes polled by pid, and
queue reasons whose node lists scontrol expands (pure parts:
tests/unit/test_long_jobs_units.py)."""

from __future__ import annotations

import pytest

from corral.backends.slurm.inventory import never_clears
from tests.unit.test_long_jobs_units import (
    INV,
)


def test_an_adopted_process_is_polled_and_waited_for_by_pid():
    import subprocess
    import sys

    from corral.procs import AdoptedProcess

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    adopted = AdoptedProcess(child.pid, lambda pid: pid == child.pid)  # the identity check
    assert AdoptedProcess(child.pid, lambda pid: False).poll() == -1  # not the worker: exited
    assert adopted.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        adopted.wait(0.1)
    child.kill()
    child.wait()
    assert adopted.poll() == -1 and adopted.wait(1.0) == -1


def test_slurm_reasons_that_never_clear():
    assert "PartitionNodeLimit" in never_clears("PartitionNodeLimit", INV)
    assert never_clears("Resources", INV) is None
    assert never_clears("Priority", INV) is None
    assert never_clears("ReqNodeNotAvail, UnavailableNodes:node1", INV) is None  # may clear
    assert "node9" in never_clears("ReqNodeNotAvail, UnavailableNodes:node9", INV)
