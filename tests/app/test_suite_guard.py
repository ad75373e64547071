"""The suite guard in tests/conftest.py turns must-have skips into failures under FUSIONLENS_STRICT=1."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


def _run(tmp_path: Path, strict: bool) -> str:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_probe.py").write_text(
        "import pytest\n"
        "def test_needs_build():\n    pytest.skip('cpu provider unavailable: simulated')\n"
        "def test_needs_gpu():\n    pytest.skip('no CUDA GPU')\n")
    env = {k: v for k, v in os.environ.items() if k != "FUSIONLENS_STRICT"}
    if strict:
        env["FUSIONLENS_STRICT"] = "1"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          str(tmp_path)], capture_output=True, text=True, env=env, cwd=tmp_path)
    return out.stdout.strip().splitlines()[-1]


def test_strict_fails_missing_project_dependency(tmp_path):
    assert _run(tmp_path, strict=True).startswith("1 failed, 1 skipped")


def test_lenient_skips(tmp_path):
    assert _run(tmp_path, strict=False).startswith("2 skipped")
