"""The optimizer's chunk loops must compile to vector code in the AVX2 and AVX-512 copies.

A run-time flag tested inside an `omp simd` loop, or c10's 16-bit conversions (a NaN branch, a
struct store), each made GCC leave a whole loop scalar without a word: LAMB's stage 1 in every
dtype, every bf16 loop and AMSGrad ran 2.3-5.5x slower while every numeric test passed
(docs/kernels.md). This reads the built extension's machine code (objdump, from the binutils that
the C++ build needs anyway) and checks each loop function for packed arithmetic at the copy's
full width, fp16 in the AVX2 copy included (c10's fp16 routines stayed scalar there; common.h's
branch-free versions vectorize).
"""
from __future__ import annotations

import platform
import re
import shutil
import subprocess
from collections import defaultdict

import pytest

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or shutil.which("objdump") is None,
    reason="needs an x86-64 build and objdump")

# adamw_chunk picks one of the adamw_loop instances; it holds the loop itself if they are inlined
LOOPS = ("adamw_loop", "adamw_chunk", "lamb_stage1", "lamb_stage2", "sumsq_chunk")
FAMILY = {"adamw_loop": "adamw", "adamw_chunk": "adamw"}
WIDTH = {"avx2": "ymm", "avx512": "zmm"}
# one function of one ISA copy: void fl_optim::isa_avx2::(anonymous namespace)::lamb_stage1<float, float, false>(...)
HEADER = re.compile(r"^[0-9a-f]+ <(?:\w+ )?fl_optim::isa_(avx2|avx512)::\(anonymous namespace\)::(\w+)<([^>]*)>\(.*>:$")
PACKED = re.compile(r"\tv(?:div|mul|add|sub|sqrt|fn?m(?:add|sub)\d{3})p[sd]\s.*%(ymm|zmm)")


def _loop_functions() -> dict[tuple[str, str, str], list[str]]:
    """{(isa, loop, template args): instruction lines} from the loaded extension's disassembly."""
    import kernels._build as build

    build.load_cpu_ops()
    so = build.build_dir_for(build._inputs()) / "fusionlens_cpu.so"
    text = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", str(so)], check=True,
                          capture_output=True, text=True).stdout
    out: dict[tuple[str, str, str], list[str]] = {}
    cur = None
    for line in text.splitlines():
        m = HEADER.match(line)
        if m:
            cur = (m.group(1), m.group(2), m.group(3)) if m.group(2) in LOOPS else None
            if cur:
                out[cur] = []
        elif cur and line.startswith(" "):
            out[cur].append(line)
        elif not line.strip():
            cur = None
    return out


def test_every_optimizer_loop_is_vectorized_in_the_avx2_and_avx512_copies() -> None:
    funcs = _loop_functions()
    found = defaultdict(set)
    scalar = []
    separate = {(isa, args.split(",")[0]) for isa, loop, args in funcs if loop == "adamw_loop"}
    for (isa, loop, args), body in funcs.items():
        dtype = args.split(",")[0]
        found[isa, FAMILY.get(loop, loop)].add(dtype)
        if loop == "adamw_chunk" and (isa, dtype) in separate:
            continue
        widths = {m.group(1) for line in body if (m := PACKED.search(line))}
        if WIDTH[isa] not in widths:
            scalar.append(f"{isa} {loop}<{args}> ({len(body)} instructions, packed: {sorted(widths) or 'none'})")
    # the check is not vacuous: every loop was found in both copies, for fp32, bf16, fp16 and fp64
    for isa in WIDTH:
        for loop in {FAMILY.get(name, name) for name in LOOPS}:
            assert {"float", "c10::BFloat16", "c10::Half", "double"} <= found[isa, loop], (isa, loop, found[isa, loop])
    assert not scalar, "loops left scalar:\n" + "\n".join(scalar)
