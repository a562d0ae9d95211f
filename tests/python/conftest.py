"""Runs each scenario in a fresh interpreter: Numba picks its memory manager once per process."""
import os
import subprocess
import sys
import textwrap

import pytest


# Settings that choose cuemm's manager, its options and adaptors: each scenario
# names those it means, so the caller's own (CUEMM_POOL_EXPANDABLE=1 in the
# shell, say) are left out rather than change what it checks. The driver's
# (CUEMM_DRIVER, CUEMM_SIM_*, NUMBA_CUDA_DRIVER) pass through.
MANAGER_SETTINGS = ("CUEMM_MEMORY_MANAGER", "CUEMM_POOL_", "CUEMM_ASYNC_", "CUEMM_PINNED_", "CUEMM_ADAPTORS",
                    "CUEMM_LIMIT", "CUEMM_LOG", "CUEMM_MAX_PENDING_", "NUMBA_CUDA_MEMORY_MANAGER")


@pytest.fixture
def run_python():
    def run(code, **environment):
        env = {k: v for k, v in os.environ.items() if not k.startswith(MANAGER_SETTINGS)}
        env.update({k: str(v) for k, v in environment.items()})
        result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        return result.stdout

    return run
