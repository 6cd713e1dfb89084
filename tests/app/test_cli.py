"""The entry point stays light: command modules load their heavy dependencies when they run (app/cli.py)."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_cli_loads_no_numpy_numba_or_textual():
    code = "import sys, app.cli; print(sorted(m for m in ('numpy', 'numba', 'textual', 'cupy') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
