"""`import corral` and a worker's start import no torch and no ray."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from corral import BaseExperimentConfig, Job, LocalScheduler

HEAVY = ["torch", "ray", "pandas", "scipy"]


def test_import_corral_imports_no_heavy_library():
    code = (
        "import sys, corral\n"
        "from corral import Job, SchedulingSpec, BaseExperimentConfig, load_expr_config\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_naming_a_backend_does_not_import_its_library():
    code = (
        "import sys\n"
        "from corral import LocalScheduler, RayScheduler, SlurmScheduler\n"
        "print([m for m in ('torch', 'ray') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_started_worker_has_imported_no_heavy_library(tmp_path):
    cfg = BaseExperimentConfig(experiment_name="imports", trial_name="t1")
    with LocalScheduler(exp_config=cfg, fileroot=str(tmp_path), gpu_devices=[]) as sched:
        (wid,) = sched.create_workers(Job(role="light", replicas=1))
        asyncio.run(sched.create_engine(wid, "corral.testing.engines.EchoEngine", "e"))
        assert sched.call_engine(wid, "loaded", "e", HEAVY) == []


def test_the_registry_imports_no_backend():
    code = (
        "import sys, corral.backends as b, corral.config; b.backend_names(); "
        "print(sorted(m for m in sys.modules if m.startswith('corral.backends.')))"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # the config's typed backend options (data only) are loaded; no backend module is
    assert out.stdout.strip() == "['corral.backends.backend_options']"
