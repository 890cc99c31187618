"""A request that waits for GPUs another trial holds says why while it waits (the
backend's pending state in the progress lines, in its own words), and starts once they
are free. (Slurm waiting behind a job that is not corral's: tests/slurm/test_long_jobs.py.)"""

from __future__ import annotations

import threading
import time

from corral import Job, SchedulingSpec

WAITING_SAYS = {
    "ray": ["PENDING", "GPU 1"],  # the placement group's state and what it asks for
    "slurm": ["(0/1 ready)", "PENDING (Resources)"],  # the job's state and Slurm's reason
}


def gpu_job(role: str, replicas: int, gpu: int) -> Job:
    return Job(role=role, replicas=replicas, tasks=[SchedulingSpec(cpu=1, gpu=gpu)])


def test_waiting_for_busy_gpus_shows_the_pending_reason_then_starts(sched, backend):
    backend.require("a queue")
    # sched's trial holds every GPU of every node; another trial asks for one
    sched.create_workers(gpu_job("hog", backend.nodes, backend.gpus_per_node))
    lines: list[str] = []
    patient = backend.scheduler(progress=lines.append, startup_timeout=90)
    try:
        result: dict = {}

        def create():
            try:
                result["ids"] = patient.create_workers(gpu_job("patient", 1, 1))
            except Exception as exc:  # reported below
                result["error"] = exc

        thread = threading.Thread(target=create)
        thread.start()
        try:
            deadline = time.monotonic() + 60
            says = WAITING_SAYS.get(backend.name, ["PENDING"])
            while not any(
                line.startswith("waiting for patient") and all(w in line for w in says)
                for line in lines
            ):
                assert thread.is_alive(), (result, lines)
                assert time.monotonic() < deadline, lines
                time.sleep(0.1)
        finally:
            sched.delete_workers("hog")
            thread.join(90)
        assert result.get("ids") == ["patient/0"], result
        assert patient.health("patient/0")["status"] == "ok"
    finally:
        patient.close()
    assert backend.leftovers(patient.experiment_name, patient.trial_name) == []
