"""benchmarks/gpu_check.sh's own logic, run here with a stand-in interpreter that says a GPU is there
and records each command (the real steps run on a lent GPU; see README "GPU check"): the steps
run in order under their timeouts, the kernel benchmarks get what the earlier steps left of the
total budget (at least 80 s), and everything lands in $OUT."""
from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTHON = """#!/usr/bin/env bash
# Stands in for the GPU image's python3: logs its arguments; every command succeeds.
echo "$*" >> "$FAKE_LOG"
[ "$1" = "-" ] && cat > /dev/null
exit 0
"""


def run_script(tmp_path: Path, total_s: int | None) -> tuple[subprocess.CompletedProcess, list[str], Path]:
    fake = tmp_path / "python3"
    fake.write_text(FAKE_PYTHON)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out, log = tmp_path / "out", tmp_path / "calls.log"
    env = dict(os.environ, PYTHON=str(fake), OUT=str(out), GPU_CHECK_SCRATCH=str(tmp_path / "scratch"),
               FAKE_LOG=str(log))
    if total_s is not None:
        env["GPU_CHECK_TOTAL_S"] = str(total_s)
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    return proc, log.read_text().splitlines(), out


def _budget(calls: list[str]) -> int:
    line = next(c for c in calls if "benchmarks/gpu/kernels_check.py" in c)
    return int(re.search(r"--budget-s (\d+)", line).group(1))


def test_steps_run_in_order_and_the_kernels_get_the_time_left(tmp_path) -> None:
    proc, calls, out = run_script(tmp_path, 200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    order = [i for i, c in enumerate(calls)
             for key in ("-m pytest", "capture_check.py", "bench_dispatch.py", "kernels_check.py") if key in c]
    assert len(order) == 4 and order == sorted(order)
    dispatch_call = next(c for c in calls if "bench_dispatch.py" in c)
    assert "--device cuda" in dispatch_call and f"--csv {tmp_path / 'scratch' / 'capture'}" in dispatch_call
    pytest_call = next(c for c in calls if "-m pytest" in c)
    assert "-k cuda" in pytest_call and "tests/kernels" in pytest_call
    assert 165 <= _budget(calls) <= 175  # 200 s minus the seconds already spent, minus 25 s margin
    log = (out / "gpu_check.log").read_text()
    for step in ("kernel_tests", "capture_check", "dispatch", "kernels_check"):
        assert f"=== {step} rc=0" in log
    assert (out / "env.txt").is_file() and "gpu_check status=0" in log


def test_kernel_benchmarks_keep_at_least_80_seconds(tmp_path) -> None:
    proc, calls, out = run_script(tmp_path, 10)  # the earlier steps "used up" the whole budget
    assert proc.returncode == 0
    assert _budget(calls) == 80 - 25
    assert not any("bench_dispatch.py" in c for c in calls)  # the optional step gives way
    assert "=== dispatch skipped" in (out / "gpu_check.log").read_text()
