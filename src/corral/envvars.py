"""The environment the controller gives every worker besides corral's own contract.

The same variables AReaL 1.0.4's schedulers set, with the same meaning: the controller's
import path on ``PYTHONPATH`` (so an engine module next to the training script imports
on the worker), fixed cache and library settings, thread counts from the worker's CPUs,
and, with ``enable_tms_offload``, the torch_memory_saver preload variables.
"""

from __future__ import annotations

import getpass
import importlib.util
import os
import sys

from corral.errors import ConfigError

THREAD_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def cache_root() -> str:
    """Where compiled-kernel caches go (``AREAL_CACHE_DIR`` as in AReaL, else /tmp/areal-<user>)."""
    return os.environ.get("AREAL_CACHE_DIR", f"/tmp/areal-{getpass.getuser()}")


def fixed_env() -> dict[str, str]:
    """The fixed variables AReaL gives its workers (cache paths, tokenizer threads, CUDA)."""
    user = getpass.getuser()
    base = f"{cache_root()}/.cache/{user}"
    return {
        "TOKENIZERS_PARALLELISM": "true",
        "PYTORCH_KERNEL_CACHE_PATH": f"{base}/torch/kernels/",
        "TRITON_CACHE_DIR": f"{base}/triton/",
        "VLLM_CACHE_ROOT": f"{base}/vllm/",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    }


def python_path() -> str:
    """The controller's working directory, its ``sys.path`` (no zip files) and its
    ``PYTHONPATH``, in that order, without duplicates."""
    parts = [os.getcwd()]
    parts += [p for p in sys.path if p and not p.endswith(".zip")]
    parts += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(parts))


def thread_env(cpu: int, spec_env: dict[str, str]) -> dict[str, str]:
    """Thread counts: the spec's value, else the controller's environment, else ``cpu``."""
    n = str(cpu if cpu and cpu > 0 else 8)
    return {name: spec_env.get(name, os.environ.get(name, n)) for name in THREAD_VARS}


def offload_env() -> dict[str, str]:
    """torch_memory_saver's preload variables (``enable_tms_offload=True``)."""
    spec = importlib.util.find_spec("torch_memory_saver")
    if spec is None or not spec.origin:
        raise ConfigError(
            "enable_tms_offload",
            True,
            "torch_memory_saver is not installed; pip install torch_memory_saver or turn "
            "offload off",
        )
    site = os.path.dirname(os.path.dirname(spec.origin))
    library = os.path.join(site, "torch_memory_saver_hook_mode_preload.abi3.so")
    if not os.path.exists(library):
        raise ConfigError(
            "enable_tms_offload", True, f"its preload library {library} is missing; reinstall it"
        )
    return {"LD_PRELOAD": library, "TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"}


def controller_env(cpu: int, spec_env: dict[str, str], offload: bool) -> dict[str, str]:
    """Everything of this module for one worker, before the spec's own ``env_vars``."""
    env = fixed_env()
    env["PYTHONPATH"] = python_path()
    env.update(thread_env(cpu, spec_env))
    if offload:
        env.update(offload_env())
    return env
