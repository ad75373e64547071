"""Benchmark scripts import the project's `kernels`, not the folder benchmarks/kernels/ beside them.

Run as `python benchmarks/X.py`, a script's own folder is sys.path[0]; with the repo root also on
PYTHONPATH (as gpu_check.sh and most shells here set it) the root came after it, so `import
kernels` found benchmarks/kernels/ as a namespace package and the script died at its first
`kernels.LayerNorm`. Every script now puts the root first, unconditionally.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_script_puts_the_root_first() -> None:
    scripts = [p for p in (ROOT / "benchmarks").rglob("*.py") if "ROOT = " in p.read_text()]
    assert len(scripts) >= 10
    for p in scripts:
        text = p.read_text()
        if "sys.path" in text:
            assert "not in sys.path" not in text, p
            assert "sys.path.insert(0, str(ROOT))" in text, p


def test_script_run_with_root_on_pythonpath_gets_the_kernels_package() -> None:
    probe = (
        "import runpy, sys\n"
        "sys.argv = ['benchmarks/bench_compiled_modules.py', '--help']\n"
        "sys.path[0] = 'benchmarks'  # as `python benchmarks/bench_compiled_modules.py` has it\n"
        "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "import kernels\nprint(kernels.__file__)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == str(ROOT / "kernels" / "__init__.py")
