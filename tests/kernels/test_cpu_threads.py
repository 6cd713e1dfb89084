"""The CPU thread pools' waits (kernels/cpu/threads.py) are in the environment before numpy loads, whether the
CLI or the inference API comes first, and a user's own settings stay."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Prints what numpy finds in the environment as it starts loading (OpenBLAS reads it then).
WATCH = """
import os, sys
class Watch:
    def find_spec(self, name, path, target=None):
        if name == "numpy":
            print(*(os.environ.get(v) for v in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OPENBLAS_THREAD_TIMEOUT")))
            sys.meta_path.remove(self)
sys.meta_path.insert(0, Watch())
import {module}
import numpy
"""


def numpy_sees(module: str, **env) -> str:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OPENBLAS_THREAD_TIMEOUT")}
    done = subprocess.run([sys.executable, "-c", WATCH.format(module=module)], capture_output=True, text=True,
                          cwd=ROOT, env=clean | {"PYTHONPATH": str(ROOT)} | env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize("module", ["app.cli", "inference"])
def test_set_before_numpy_loads(module):
    assert numpy_sees(module) == "PASSIVE 10000 4"


def test_the_users_settings_stay():
    assert numpy_sees("app.cli", OMP_WAIT_POLICY="ACTIVE", GOMP_SPINCOUNT="0",
                      OPENBLAS_THREAD_TIMEOUT="10") == "ACTIVE 0 10"
