"""Every Triton kernel compiles for a real GPU (sm_90: H100/H200), without spills or scalar loads
where the sizes allow better, checked on this GPU-less machine (see tests/kernels/triton_aot.py).

The interpreter tests check what the kernels compute; this checks what only Triton's compiler and
ptxas can say: that each variant the public API launches at the GPU check's shapes compiles, and
what it costs in registers, local memory and load width.
"""
from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kernels.triton_aot import SHARED_LIMIT, TRITON_MODULES

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[2]

# The argument whose divisibility by 16 decides whether a variant can use vector loads.
SIZE_ARG = {
    "triton_norms._ln_fwd": "N", "triton_norms._ln_bwd": "N", "triton_norms._rms_fwd": "N",
    "triton_norms._rms_bwd": "N",
    "triton_activations._act_fwd_kernel": "N", "triton_activations._act_bwd_kernel": "N",
    "triton_activations._glu_fwd_kernel": "numel", "triton_activations._glu_bwd_kernel": "numel",
    # the row-strided halves: the drivers' halves have row strides 2N, aligned whenever N is
    "triton_activations._glu_rows_fwd_kernel": "N", "triton_activations._glu_rows_bwd_kernel": "N",
    "triton_softmax._fwd_kernel": "N", "triton_softmax._bwd_kernel": "N", "triton_rope._rope_kernel": "HALF",
    "triton_cross_entropy._ce_forward_kernel": "V", "triton_cross_entropy._ce_backward_kernel": "V",
    "triton_cross_entropy._ce_fused_kernel": "V",
    # pointer tables: the kernels take their vector path when the host finds every tensor aligned
    "triton_optim._adamw_kernel": None, "triton_optim._lamb_stage1": None, "triton_optim._lamb_stage2": None,
}
NORMS = {"triton_norms._ln_fwd", "triton_norms._ln_bwd", "triton_norms._rms_fwd", "triton_norms._rms_bwd"}


def launched_kernels() -> set[str]:
    """Names of the @triton.jit functions the kernels package launches (`name[grid](...)`)."""
    names: set[str] = set()
    for path in (ROOT / "kernels").glob("triton_*.py"):
        names |= {f"{path.stem}.{n}" for n in re.findall(r"\b(_\w+)\[[^\]\n]*\]\(", path.read_text())}
    return names


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("aot") / "sm90.csv"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.triton_aot", "--arch", "90", "--csv", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    with out.open() as f:
        return list(csv.DictReader(f))


def _aligned(row: dict) -> bool:
    arg = SIZE_ARG[row["kernel"]]
    return arg is None or f" {arg}:i32/16" in f" {row['signature']}"


def _block(row: dict) -> int:
    m = re.search(r"\bBLOCK=(\d+)", row["constexprs"])
    return int(m.group(1)) if m else 0


def test_every_launched_kernel_compiles_for_sm90(variants) -> None:
    launched = launched_kernels()
    assert launched == set(SIZE_ARG), f"update SIZE_ARG: {sorted(launched ^ set(SIZE_ARG))}"
    files = {f"kernels.{p.stem}" for p in (ROOT / "kernels").glob("triton_*.py")}
    assert files == set(TRITON_MODULES), "update triton_aot.TRITON_MODULES"
    compiled = {v["kernel"] for v in variants}
    assert compiled == launched, f"never compiled: {sorted(launched - compiled)}"
    # both dtypes the drivers use reached every family
    for dtype in ("fp32", "bf16"):
        reached = {v["kernel"] for v in variants
                   if f"*{dtype}" in v["signature"] or f"DT={dtype}" in v["constexprs"]}
        assert reached == launched, dtype


def test_shared_memory_fits_sm90(variants) -> None:
    for v in variants:
        assert int(v["shared"]) <= SHARED_LIMIT[90], v


def test_no_spills_except_long_norm_rows(variants) -> None:
    """Only rows a single block cannot hold in registers may spill: norm rows over 8192 elements
    (BLOCK 16384 and up), or unaligned ones of 4097+ (scalar addressing doubles the registers)."""
    for v in variants:
        if int(v["spill_stores"]) or int(v["spill_loads"]):
            allowed = v["kernel"] in NORMS and (_block(v) >= 16384 or (_block(v) >= 8192 and not _aligned(v)))
            assert allowed, f"{v['kernel']} spills: {v}"
    # and the common transformer rows are register-resident
    for v in variants:
        if v["kernel"] in NORMS and _aligned(v) and _block(v) <= 8192:
            assert int(v["spill_stores"]) == 0, v


def test_vector_loads_at_aligned_sizes(variants) -> None:
    """At 16-divisible sizes every kernel issues vector loads: 128-bit where a thread owns 4+ fp32
    or 8+ bf16 contiguous elements, at least 64-bit everywhere."""
    for v in variants:
        if _aligned(v):
            assert int(v["widest_load_bits"]) >= 64, f"{v['kernel']} loads {v['loads']}: {v}"
    for name in SIZE_ARG:
        widest = max(int(v["widest_load_bits"]) for v in variants if v["kernel"] == name)
        assert widest == 128, f"{name} never issues a 128-bit load"
    # cross-entropy peels odd rows (GPT-2's 50257 columns) to their 16-byte boundary: 128-bit too
    odd = [v for v in variants if v["kernel"].startswith("triton_cross_entropy.") and "PEEL=True" in v["constexprs"]]
    assert {v["kernel"] for v in odd} == {k for k in SIZE_ARG if k.startswith("triton_cross_entropy.")}
    assert all(int(v["widest_load_bits"]) == 128 for v in odd), odd


def test_load_widths_parser() -> None:
    from tests.kernels.triton_aot import load_widths

    ptx = ("ld.global.v4.b32 {%r1, %r2, %r3, %r4}, [%rd1];\n@%p1 ld.global.L1::evict_last.v2.b32 {..}, [%rd2];\n"
           "ld.global.b16 %rs1, [%rd3];\nld.global.nc.v4.b16 {..}, [%rd4];\nst.global.v4.b32 [%rd5], {..};")
    assert load_widths(ptx) == {128: 1, 64: 2, 16: 1}


def test_gpu_check_warps_sweep_compiles_every_warp_count() -> None:
    """benchmarks/kernels/norms_warps.py (run last by the GPU check) calls the launchers with every
    warp count: each call compiles here for sm_90, so the lent GPU's minutes are not lost on it."""
    code = """
from tests.kernels.triton_aot import compile_only
from benchmarks.kernels.norms_warps import gpu_cases, WARPS
with compile_only(90) as vs:
    cases = gpu_cases("cpu")
    for case in cases:
        for fn in case["variants"].values():
            fn()
seen = {(v.kernel, v.num_warps) for v in vs}
for k in ("triton_norms._ln_bwd", "triton_norms._rms_bwd", "triton_norms._ln_fwd"):
    assert {w for name, w in seen if name == k} >= set(WARPS), (k, seen)
print(len(cases), "cases", len(vs), "variants")
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "5 cases" in proc.stdout


def test_gpu_check_lists_the_compiled_variants() -> None:
    """benchmarks/gpu/kernels_check.compiled_resources walks our kernels' Triton caches: here, after
    compile-only launches, every variant is listed with its constexprs, warps and shared memory;
    registers and spills stay None until a driver loads the kernel (on the GPU)."""
    code = """
from tests.kernels.triton_aot import compile_only, drive_rope, drive_softmax
from benchmarks.gpu.kernels_check import compiled_resources
from tests.kernels.triton_aot import TRITON_MODULES
with compile_only(90) as vs:
    drive_rope(False)
    drive_softmax(False)
rows = compiled_resources()
assert {r["kernel"] for r in rows} == {v.kernel for v in vs}, rows
assert len(rows) >= len({(v.kernel, v.constexprs, v.num_warps) for v in vs}), (len(rows), len(vs))
assert all(r["registers"] is None and r["local_bytes"] is None for r in rows)
assert all(r["num_warps"] in (4, 8, 16) and r["shared"] is not None for r in rows)
assert any("ROWS_P=" in r["constexprs"] and "BLOCK_H=" in r["constexprs"] for r in rows)
assert {m.rsplit(".", 1)[-1] for m in TRITON_MODULES} >= {r["kernel"].split(".")[0] for r in rows}
print(len(rows))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
