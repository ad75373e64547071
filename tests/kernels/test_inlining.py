"""The per-element helpers that the kernels' simd loops call are inlined in the built library.

An out-of-line call inside an `omp simd` loop turns it scalar (one call per element): GCC left
exp_nonpos out of line in softmax's rows once the sources stopped including <torch/extension.h>
(11x slower), then sigmoid in GELU-tanh's spans once exp_nonpos was forced inline. The helpers are
FL_INLINE (always_inline, common.h); this reads the library's disassembly (objdump, from binutils,
which the C++ build needs anyway) and fails if any function calls one of them.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from kernels import _build

# Helpers called per element inside simd loops (kernels/csrc/common.h and the *_impl.h files).
PER_ELEMENT = ("exp_nonpos", "bf16_bits_to_float", "float_to_bf16_bits", "sigmoid", "erf_abs_scaled",
               "gelu_tanh_arg", "select_bits", "bits_of", "float_of", "act<", "act_and_grad<", "vmax", "fmadd<")
CALL = re.compile(r"\bcall\s+[0-9a-f]+ <(?P<target>[^>]*)>")


def _called_functions(lib: str) -> set[str]:
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.fail("objdump not found: install binutils (the C++ build's linker comes with it)")
    text = subprocess.run([objdump, "-d", "-C", "--no-show-raw-insn", lib], check=True,
                          capture_output=True, text=True).stdout
    return {m.group("target") for m in CALL.finditer(text)}


def test_no_per_element_helper_is_called_out_of_line() -> None:
    _build.load_cpu_ops()
    lib = _build.build_dir_for(_build._inputs()) / "fusionlens_cpu.so"
    called = _called_functions(str(lib))
    assert any("parallel_for" in c or "GOMP" in c for c in called), "disassembly not read"  # the check sees calls
    name = re.compile(r"::(" + "|".join(re.escape(h) for h in PER_ELEMENT) + r")")
    offenders = sorted(c for c in called if name.search(c))
    assert not offenders, f"called out of line (a scalar call per element in a simd loop): {offenders}"
