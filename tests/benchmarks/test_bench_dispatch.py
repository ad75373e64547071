"""benchmarks/bench_dispatch.py end to end at a toy size: every kernel's three variants are timed,
the table names the provider the choice picked, and the rows land where --csv says."""
from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def test_bench_dispatch_writes_every_kernel_and_variant(tmp_path) -> None:
    out = tmp_path / "sub" / "dispatch.csv"
    proc = subprocess.run([sys.executable, "benchmarks/bench_dispatch.py", "--hidden", "256", "--rounds", "2",
                           "--inner", "5", "--generate", "3", "--csv", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(out.open()))
    calls = [r for r in rows if r["benchmark"] != "dispatch_generate_llama"]
    kernels = {"rms_norm", "add_rms_norm", "layer_norm", "gelu", "swiglu", "softmax", "rope"}
    assert {r["benchmark"] for r in calls} == {f"dispatch_{k}" for k in kernels}
    assert {r["variant"] for r in rows} == {"eager", "ours", "ours_no_memo"} | ({"hf"} if len(calls) < len(rows) else set())
    assert all(float(r["p50"]) > 0 and r["unit"] == "us" and r["shape"] == "1x256" for r in calls)
    assert all("picked=" in r["notes"] for r in calls)
    generated = [r for r in rows if r["benchmark"] == "dispatch_generate_llama"]
    if importlib.util.find_spec("transformers") is not None:  # the copy with our kernels says the same
        assert generated and all("same_tokens=True" in r["notes"] and r["unit"] == "ms/token" for r in generated)
    table = proc.stdout.split("eager/ours")[1]
    assert all(k in table for k in kernels)
    cuda = subprocess.run([sys.executable, "benchmarks/bench_dispatch.py", "--device", "cuda", "--hidden", "256",
                           "--rounds", "1", "--inner", "2", "--csv", str(tmp_path / "cuda.csv")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if torch.cuda.is_available():
        assert cuda.returncode == 0, cuda.stderr[-3000:]
    else:  # one line, no traceback
        assert cuda.returncode != 0 and "no CUDA GPU" in cuda.stderr and "Traceback" not in cuda.stderr
