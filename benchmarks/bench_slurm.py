"""corral on Slurm: a placeholder until ``corral.backends.slurm`` exists.

When the Slurm backend lands, this module adds ``slurm.*`` rows (cold start through
sbatch/srun, noop latency, payload round trip, delete) measured on the test cluster of
``/work/shared/recipes``, with the local figures (``ctx.row("local....")``) and the bare
``srun`` of ``python -c pass`` as baselines.
"""

from __future__ import annotations

from common import BackendUnavailable, Context, Row

NAME = "slurm"


def check() -> str | None:
    """Why the Slurm rows cannot run here, or None."""
    try:
        import corral.backends.slurm  # noqa: F401
    except Exception as exc:
        return (
            "corral.backends.slurm cannot be imported "
            f"({type(exc).__name__}: {exc}); the Slurm backend is not available yet"
        )
    return None


def run(ctx: Context) -> list[Row]:
    reason = check()
    if reason:
        raise BackendUnavailable(reason)
    raise BackendUnavailable(
        "corral.backends.slurm imports, but the Slurm rows are not written yet "
        "(see this module's docstring for what they measure)"
    )
