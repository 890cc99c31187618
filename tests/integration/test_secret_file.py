"""A started scheduler writes the trial secret to a private file (validation without processes:
tests/unit/test_spec_validation.py)."""

from __future__ import annotations

import os

from corral.backends.local import LocalScheduler
from corral.spec import (
    Job,
    SchedulingSpec,
)
from tests.unit.test_spec_validation import (  # noqa: F401  (fixtures of the unit tests)
    scheduler,
)


def test_secret_file_is_private(scheduler: LocalScheduler) -> None:  # noqa: F811  (the imported fixtures)
    # written when the run claims its trial (its first create_workers), not before:
    # a refused second controller must not overwrite a live run's secret
    assert not os.path.exists(scheduler.secret_file)
    scheduler.create_workers(Job(role="w", replicas=1, tasks=[SchedulingSpec(cpu=1)]))
    scheduler.delete_workers()
    mode = os.stat(scheduler.secret_file).st_mode & 0o777
    assert mode == 0o600
    assert os.stat(os.path.dirname(scheduler.secret_file)).st_mode & 0o777 == 0o700
    with open(scheduler.secret_file) as fh:
        assert fh.read() == scheduler.secret
    assert len(scheduler.secret) >= 32
