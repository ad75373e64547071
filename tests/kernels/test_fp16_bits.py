"""common.h's branch-free fp16 conversions are c10's bit routines, bit for bit, on every input.

The optimizers' 16-bit loads and stores go through them (optim_impl.h) so that GCC vectorizes the
fp16 loops in the AVX2 copy; c10's own versions (two branches) kept those loops scalar. A C++
harness compares both directions exhaustively: all 2^16 halves, all 2^32 floats (~25 s, most of it
c10's scalar routine). NaN goes to sign | 0x7E00 as in c10, so state dicts match torch's.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CSRC = HERE.parents[1] / "kernels" / "csrc"
CXX = shutil.which("c++") or shutil.which("g++")


@pytest.mark.skipif(CXX is None, reason="needs a C++ compiler")
def test_fp16_conversions_equal_c10s_on_every_half_and_every_float(tmp_path: Path) -> None:
    from torch.utils.cpp_extension import include_paths

    exe = tmp_path / "fp16_bits_check"
    includes = [f"-I{p}" for p in include_paths()] + [f"-I{CSRC}"]
    subprocess.run([CXX, "-std=c++20", "-O3", *includes, str(HERE / "csrc" / "fp16_bits_check.cpp"),
                    "-o", str(exe)], check=True, capture_output=True, text=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "mismatches: load 0 of 65536, store 0 of 4294967296" in run.stdout
