"""The Triton optimizers' code paths and their table caches (kernels/triton_optim.py).

- the alignment decision (a pure helper) on aligned tensors, a view at element offset 1 of a flat
  buffer, and absent lists;
- interpreted: the ALIGNED path (unmasked whole chunks, masked tail), the masked path (every
  parameter misaligned) and a mixed bucket (one misaligned parameter: the kernel decides per
  tensor from the pointer table's flag column) all match torch.optim.AdamW / the fp32 LAMB
  reference over several steps, at numels that are exact multiples of BLOCK and ones with a tail,
  and agree bit for bit;
- the chunk/pointer table caches: contents recomputed in plain Python, a hit on step 2, a pointer
  miss (chunk hit) when a parameter is replaced by a new tensor, the LRU bound, the flag column;
- compiled for sm_90 on this GPU-less machine (tests/kernels/triton_aot.py): every optimizer
  variant the public API launches issues 128-bit loads, without spills, mixed buckets included.
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.kernels.numerics import run_in_triton_interpreter

pytest.importorskip("triton")

from kernels import triton_optim as to  # noqa: E402  (needs triton)

ROOT = Path(__file__).resolve().parents[2]
KERNEL_NAMES = ("_adamw_kernel", "_lamb_stage1", "_lamb_stage2")


def offset1(p: torch.Tensor) -> nn.Parameter:
    """p's values as a dense parameter one element past a 16-byte boundary (a flat buffer's view)."""
    flat = torch.zeros(p.numel() + 1, dtype=p.dtype, device=p.device)
    flat[1:].copy_(p.detach().flatten())
    return nn.Parameter(flat[1:].view(p.shape))


def only_first_nonempty(layout):
    """A param_layout for tests.kernels.test_optim.run that changes only the first non-empty
    parameter (an empty one has no chunk, so its alignment never matters)."""
    done: list[bool] = []

    def apply(p):
        if done or p.numel() == 0:
            return p
        done.append(True)
        return layout(p)
    return apply


class LaunchSpy:
    """Stands in for a @triton.jit kernel: records each launch's ALIGNED, then launches."""

    def __init__(self, kernel, record: list) -> None:
        self.kernel, self.record = kernel, record

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.record.append(kwargs["ALIGNED"])
            return self.kernel[grid](*args, **kwargs)
        return launch


# ---- the alignment decision ------------------------------------------------------------------

def test_alignment_helper_on_aligned_offset_and_absent_lists() -> None:
    a, b = torch.zeros(5), torch.zeros(3, 7)
    flat = torch.zeros(101)
    shifted = flat[1:].view(10, 10)  # dense, but 4 bytes past a 16-byte boundary
    assert a.data_ptr() % 16 == 0 and shifted.data_ptr() % 16 == 4
    assert to.all_aligned(to.pointer_columns([[a, b], [a, b], [a, b], [a, b], []]))
    assert not to.all_aligned(to.pointer_columns([[a, shifted], [a, b], [a, b], [a, b]]))
    assert not to.all_aligned(to.pointer_columns([[a], [a], [a], [a], [flat[1:5]]]))  # only vmax off
    cols = to.pointer_columns([[a, b], [b, a], [a, a], [b, b]])
    assert cols == ((a.data_ptr(), b.data_ptr()), (b.data_ptr(), a.data_ptr()),
                    (a.data_ptr(), a.data_ptr()), (b.data_ptr(), b.data_ptr()), (0, 0))
    assert to.all_aligned([(16, 32, 0)]) and not to.all_aligned([(16, 8)])
    assert to.all_aligned([(8, 24)], align_bytes=8)


# ---- the table caches ------------------------------------------------------------------------

def _expected_chunks(numels: list[int]) -> tuple[list[int], list[int], list[int], list[int]]:
    """(chunk tensor index, chunk start, first chunk, last chunk) in plain Python."""
    t_idx, starts, first, last = [], [], [], []
    for i, n in enumerate(numels):
        first.append(len(t_idx))
        for s in range(0, n, to.BLOCK):
            t_idx.append(i)
            starts.append(s)
        last.append(len(t_idx) - 1)
    return t_idx, starts, first, last


def test_tables_content_hits_misses_and_bound() -> None:
    cpu = torch.device("cpu")
    numels = [1, to.BLOCK, 2 * to.BLOCK, to.BLOCK + 1, 0, 3 * to.BLOCK - 5]
    ps = [torch.zeros(n) for n in numels]
    lists = [ps, [torch.zeros(n) for n in numels], [torch.zeros(n) for n in numels],
             [torch.zeros(n) for n in numels], []]
    to.CHUNK_TABLES.clear()
    to.POINTER_TABLES.clear()
    tab, ptrs, aligned = to.tables(lists, cpu)
    t_idx, starts, first, last = _expected_chunks(numels)
    assert tab.n_chunks == len(t_idx) == 1 + 1 + 2 + 2 + 0 + 3
    assert tab.chunk_t.tolist() == t_idx and tab.chunk_s.tolist() == starts
    assert tab.numels.tolist() == numels
    assert tab.counts.tolist() == [b + 1 - a for a, b in zip(first, last)]
    assert ptrs.tolist() == [[lst[i].data_ptr() if lst else 0 for lst in lists] + [1] for i in range(len(ps))]
    assert to.SLOTS == 6 and ptrs.shape == (len(ps), to.SLOTS)
    assert aligned and (to.CHUNK_TABLES.misses, to.POINTER_TABLES.misses) == (1, 1)

    again = to.tables(lists, cpu)  # the next step: same tensors, no rebuild
    assert again[0] is tab and again[1] is ptrs
    assert (to.CHUNK_TABLES.hits, to.POINTER_TABLES.hits) == (1, 1)

    replaced = torch.zeros(numels[2])  # a new tensor of the same size: pointer miss, chunk hit
    lists[0] = ps[:2] + [replaced] + ps[3:]
    tab2, ptrs2, _ = to.tables(lists, cpu)
    assert tab2 is tab and ptrs2 is not ptrs and int(ptrs2[2, 0]) == replaced.data_ptr()
    assert (to.CHUNK_TABLES.hits, to.POINTER_TABLES.misses) == (2, 2)

    for k in range(1, to.CACHE_ENTRIES + 2):  # LRU: bounded, the oldest entry goes first
        to.tables([[torch.zeros(k)]] * 4, cpu)
    assert len(to.CHUNK_TABLES) == len(to.POINTER_TABLES) == to.CACHE_ENTRIES
    misses = to.CHUNK_TABLES.misses
    to.tables(lists, cpu)
    assert to.CHUNK_TABLES.misses == misses + 1  # evicted
    lists[3] = lists[3][:3] + [torch.zeros(numels[3] + 1)[1:]] + lists[3][4:]
    _, mixed_ptrs, mixed_aligned = to.tables(lists, cpu)
    assert not mixed_aligned  # one misaligned moment: the bucket decides per tensor ...
    assert mixed_ptrs[:, 5].tolist() == [1, 1, 1, 0, 1, 1]  # ... and only tensor 3 is masked
    with pytest.raises(ValueError, match="at least one"):
        to.TableCache(0)


# ---- both paths against torch (interpreted here; compiled on a GPU) --------------------------

def check_paths(device: str, shapes: tuple, steps: int) -> int:
    """Step each optimizer config through `steps` steps twice, with every parameter aligned and with
    each one a view at element offset 1 (the masked path), in fp32 and bf16. Asserts: every launch
    took the expected path; both runs agree bit for bit; both match torch.optim.AdamW / the LAMB
    reference (judged against float64 as numerics.assert_matches does; within a few fp32 ulps of
    the fp32 eager result on the interpreter). Returns the number of configs checked."""
    from kernels.optim import LAMB, AdamW
    from tests.kernels.numerics import assert_matches, max_err
    from tests.kernels.test_optim import grad_sequence, initial, run

    names = [str(s) for s in shapes]
    p0 = [p.to(device) for p in initial(shapes)]
    seq = [[g.to(device) for g in gs] for gs in grad_sequence(shapes, steps=steps)]
    launches: list[bool] = []
    real = {name: getattr(to, name) for name in KERNEL_NAMES}

    def paths(make, dtype):
        launches.clear()
        aligned = run(make, p0, seq, dtype)
        took = set(launches)
        launches.clear()
        shifted = run(make, p0, seq, dtype, offset1)
        took_shifted = set(launches)
        launches.clear()
        mixed = run(make, p0, seq, dtype, only_first_nonempty(offset1))  # per-tensor choice inside the kernel
        assert took == {True} and took_shifted == set(launches) == {False}, (took, took_shifted, launches)
        for a, b, c, name in zip(aligned, shifted, mixed, names):  # same fp32 math, same order
            assert torch.equal(a, b), f"{name}: the aligned and masked paths differ"
            assert torch.equal(a, c), f"{name}: the mixed bucket differs"
        return aligned

    def scale(t):
        return max(1.0, float(t.abs().max())) if t.numel() else 1.0

    adamw = (dict(lr=1e-2, weight_decay=0.1), dict(lr=1e-2, amsgrad=True, maximize=True))
    lamb = (dict(lr=1e-2), dict(lr=1e-2, weight_decay=0.0, use_nvlamb=True))
    checked = 0
    for name in KERNEL_NAMES:
        setattr(to, name, LaunchSpy(real[name], launches))
    try:
        for dtype in (torch.float32, torch.bfloat16):
            ulps = 4 * torch.finfo(dtype).eps
            for hp in adamw:
                ours = paths(lambda ps: AdamW(ps, provider="triton", **hp), dtype)
                eager = run(lambda ps: torch.optim.AdamW(ps, foreach=False, **hp), p0, seq, dtype)
                truth = run(lambda ps: torch.optim.AdamW(ps, foreach=False, **hp), p0, seq, torch.float64)
                assert_matches(ours, eager, truth, dtype, names=names)
                if dtype == torch.float32 and device == "cpu":
                    for o, e, n in zip(ours, eager, names):
                        assert max_err(o, e) <= 16 * ulps * scale(e), (n, hp, max_err(o, e))
                checked += 1
            for hp in lamb:
                ours = paths(lambda ps: LAMB(ps, provider="triton", **hp), dtype)
                eager = run(lambda ps: LAMB(ps, provider="reference", **hp), p0, seq, dtype)  # fp32 math
                truth = run(lambda ps: LAMB(ps, provider="reference", **hp), p0, seq, torch.float64)
                assert_matches(ours, eager, truth, dtype, names=names)
                if device == "cpu":
                    for o, e, n in zip(ours, eager, names):
                        assert max_err(o, e) <= ulps * scale(e), (n, hp, dtype, max_err(o, e))
                checked += 1
    finally:
        for name, kernel in real.items():
            setattr(to, name, kernel)
    return checked


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA GPU present: test_cuda_* checks the compiled kernels")
def test_aligned_and_masked_paths_match_torch_and_each_other_interpreted() -> None:
    code = ("from kernels import triton_optim as to\n"
            "from tests.kernels.test_optim_triton_paths import check_paths\n"
            "B = to.BLOCK\n"  # empty, whole chunks only, and tails
            "print(check_paths('cpu', ((0,), (B,), (2, B), (1500,), (B + 1,), (7, 3), ()), 3))\n")
    assert int(run_in_triton_interpreter(code).strip().splitlines()[-1]) == 8


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
def test_cuda_aligned_and_masked_paths_match_torch_and_each_other() -> None:
    B = to.BLOCK
    assert check_paths("cuda", ((0,), (64, B), (768, 2304), (100003,), (B + 1,), (7, 3), ()), 10) == 8


_CACHE_SCRIPT = """
import torch
from torch import nn
from kernels import triton_optim as to
from kernels.optim import AdamW

def params():
    g = torch.Generator().manual_seed(0)
    ps = [nn.Parameter(torch.randn(s, generator=g)) for s in ((1500,), (7, 3), (1024,))]
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)
    return ps

ours, theirs = params(), params()
a = AdamW(ours, lr=1e-2, provider="triton")
b = torch.optim.AdamW(theirs, lr=1e-2, foreach=False)
to.CHUNK_TABLES.clear()
to.POINTER_TABLES.clear()
counts = []
def step():
    a.step()
    b.step()
    counts.append((to.CHUNK_TABLES.hits, to.CHUNK_TABLES.misses,
                   to.POINTER_TABLES.hits, to.POINTER_TABLES.misses))
step()
step()
# replace parameter 0 by a new tensor (the old one stays alive, so the address differs) in both
for opt, ps in ((a, ours), (b, theirs)):
    new = nn.Parameter(ps[0].detach().clone())
    new.grad = ps[0].grad.clone()
    opt.param_groups[0]["params"][0] = new
    opt.state[new] = opt.state.pop(ps[0])
    ps.append(ps[0])
    ps[0] = new
step()
step()
assert counts == [(0, 1, 0, 1), (1, 1, 1, 1), (2, 1, 1, 2), (3, 1, 2, 2)], counts
for x, y in zip(ours[:3], theirs[:3]):  # the new tensor was stepped, through the new table
    torch.testing.assert_close(x, y, rtol=0, atol=1e-6)
assert not torch.equal(ours[0], ours[3])
print("ok")
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA GPU present: interpreter-only test")
def test_table_cache_hits_on_step_2_and_misses_on_a_new_tensor_interpreted() -> None:
    assert run_in_triton_interpreter(_CACHE_SCRIPT).strip().splitlines()[-1] == "ok"


# ---- compiled for sm_90 (no GPU needed) ------------------------------------------------------

_MASKED_AOT_SCRIPT = """
import torch
from torch import nn
import kernels
from tests.kernels.triton_aot import compile_only
with compile_only(90) as variants:
    for dtype in (torch.float32, torch.bfloat16):
        flat = torch.zeros(4097, dtype=dtype)
        ps = [nn.Parameter(flat[1:].view(4, 1024)), nn.Parameter(torch.zeros(3000, dtype=dtype))]
        for p in ps:
            p.grad = torch.zeros_like(p)
        kernels.AdamW(ps, amsgrad=True, maximize=True, provider="triton").step()
        kernels.LAMB(ps, provider="triton").step()
for v in variants:
    print(v.kernel.rsplit(".", 1)[-1], v.constexprs.replace(" ", ","), v.registers, v.spill_stores + v.spill_loads,
          v.widest_load_bits)
"""


def _name(kernel: str) -> str:
    """The jit function's name (the AOT table may qualify it with its module)."""
    return kernel.rsplit(".", 1)[-1]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_sm90_optimizer_variants_use_128_bit_loads_without_spills(tmp_path) -> None:
    out = tmp_path / "optim.csv"
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.triton_aot", "--arch", "90",
                           "--family", "optim", "--csv", str(out)], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert {_name(r["kernel"]) for r in rows} == {"_adamw_kernel", "_lamb_stage1", "_lamb_stage2"}
    for r in rows:
        assert "ALIGNED=True" in r["constexprs"], r  # the driver's fresh allocations are aligned
        assert int(r["widest_load_bits"]) == 128, r
        assert int(r["spill_stores"]) == int(r["spill_loads"]) == 0, r


def test_sm90_masked_path_and_amsgrad_compile_without_spills() -> None:
    proc = subprocess.run([sys.executable, "-c", _MASKED_AOT_SCRIPT], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.strip().splitlines()]
    seen = {(k, "DT=bf16" in c) for k, c, *_ in rows}
    assert seen == {(k, bf) for k in ("_adamw_kernel", "_lamb_stage1", "_lamb_stage2") for bf in (False, True)}
    assert all("AMSGRAD=True" in c and "MAXIMIZE=True" in c for k, c, *_ in rows if k == "_adamw_kernel")
    for kernel, consts, regs, spills, widest in rows:
        assert "ALIGNED=False" in consts, (kernel, consts)  # one misaligned param: a mixed bucket
        assert int(spills) == 0, (kernel, consts, regs)
        assert int(widest) == 128, (kernel, consts, widest)  # the aligned tensors keep 128-bit loads
