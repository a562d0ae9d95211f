"""Runs each scenario in a fresh interpreter: Numba picks its memory manager once per process."""
import os
import subprocess
import sys
import textwrap

import pytest


@pytest.fixture
def run_python():
    def run(code, **environment):
        env = dict(os.environ)
        env.update({k: str(v) for k, v in environment.items()})
        result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                                text=True, timeout=300)
        assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        return result.stdout

    return run
