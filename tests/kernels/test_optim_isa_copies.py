"""The C++ optimizer's instruction-set copies (optim.cpp compiles its chunk loops once per ISA,
picked at run time; FUSIONLENS_CPU_ISA lowers the pick): every copy this CPU runs steps 100
times against float64 within eager's error, and the AVX2 and AVX-512 AdamW copies are torch's
fused AdamW bit for bit. Shapes, grad sequences and the float64 LAMB come from test_optim."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels.optim import LAMB, AdamW
from tests.kernels.numerics import assert_matches
from tests.kernels.test_optim import SHAPES, grad_sequence, initial, lamb_float64, run

pytestmark = pytest.mark.usefixtures("cpu_provider")


ISA_ORDER = ["base", "avx2", "avx512"]
# 1001 and 65-wide rows leave tails after every vector width; 40000 spans two 32768-element chunks
ISA_SHAPES = ((), (7, 3), (1001,), (64, 65), (40000,))


@pytest.mark.parametrize("isa", ["avx512", "avx2", "base"])
def test_every_instruction_set_copy_matches_over_100_steps(isa: str, monkeypatch) -> None:
    """optim.cpp compiles its chunk loops once per instruction set, picked at run time;
    FUSIONLENS_CPU_ISA lowers the pick, so every copy this CPU can run steps 100 times here:
    AdamW (plain and AMSGrad) vs torch.optim.AdamW, LAMB (with global clipping, so multi_sumsq
    runs too) vs the float64 LAMB, fp32 and bf16, each judged by eager's own error vs float64."""
    monkeypatch.setenv("FUSIONLENS_CPU_ISA", isa)
    kernels.available_providers()
    assert ISA_ORDER.index(torch.ops.fusionlens.optim_isa()) <= ISA_ORDER.index(isa)
    p0, names = initial(ISA_SHAPES), [str(s) for s in ISA_SHAPES]
    seq = grad_sequence(ISA_SHAPES)
    for amsgrad in (False, True):
        hp = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, amsgrad=amsgrad)
        truth = run(lambda ps: torch.optim.AdamW(ps, foreach=False, **hp), p0, seq, torch.float64)
        for dtype in (torch.float32, torch.bfloat16):
            ours = run(lambda ps: AdamW(ps, provider="cpu", **hp), p0, seq, dtype)
            eager = run(lambda ps: torch.optim.AdamW(ps, foreach=False, **hp), p0, seq, dtype)
            assert_matches(ours, eager, truth, dtype, names=names)
    hp = dict(lr=2e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, max_grad_norm=1.0, use_nvlamb=False)
    seq = grad_sequence(ISA_SHAPES, scale=3.0)
    truth = lamb_float64([p.clone() for p in p0], seq, **hp)
    for dtype in (torch.float32, torch.bfloat16):
        ours = run(lambda ps: LAMB(ps, provider="cpu", **hp), p0, seq, dtype)
        eager = run(lambda ps: LAMB(ps, provider="reference", **hp), p0, seq, dtype)
        assert_matches(ours, eager, truth, dtype, names=names)
        if dtype == torch.float32:
            for o, t in zip(ours, truth):
                assert torch.allclose(o.double(), t, rtol=1e-4, atol=1e-5)


FUSED_CASES = {"decay": dict(weight_decay=0.1), "amsgrad": dict(weight_decay=0.1, amsgrad=True),
               "lerp-high-maximize": dict(betas=(0.3, 0.99), weight_decay=0.0, maximize=True)}


@pytest.mark.parametrize("case", sorted(FUSED_CASES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("isa", ["avx512", "avx2"])
def test_adamw_matches_torchs_fused_adamw_bit_for_bit_in_every_vector_copy(isa, dtype, case, monkeypatch) -> None:
    """The AVX-512 and AVX2 copies of the AdamW loop are torch.optim.AdamW(fused=True) bit for bit,
    fp32 and 16-bit, over 100 steps: the same operations in the same order, FMAs only where ATen's
    vectorized kernel has them (the loop is compiled without implicit contraction). The vector tails run
    too (1001 elements, 65-wide rows, two 32768-element chunks). torch.lerp's other side (weight
    1 - beta1 >= 0.5) and maximize as well. Was 1 ulp off in half the fp32 elements (GCC had
    contracted p * decay + update into one FMA) and in a few 16-bit ones once those loops vectorized."""
    monkeypatch.setenv("FUSIONLENS_CPU_ISA", isa)
    kernels.available_providers()
    if torch.ops.fusionlens.optim_isa() != isa:
        pytest.skip(f"this CPU has no {isa}")
    hp = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-8) | FUSED_CASES[case]
    shapes = SHAPES + ((40000,),)
    p0 = initial(shapes)
    # contiguous grads: torch 2.13's fused CPU step reads a transposed grad as if laid out as its
    # parameter (0.02 off after one fp32 step, where ours and the for-loop are 2.5e-7 off float64)
    seq = [[g.contiguous() for g in grads] for grads in grad_sequence(shapes)]
    ours = run(lambda ps: AdamW(ps, provider="cpu", **hp), p0, seq, dtype)
    fused = run(lambda ps: torch.optim.AdamW(ps, fused=True, **hp), p0, seq, dtype)
    # ATen's fp32 kernel runs the last numel % (its vector width) elements of a tensor through a
    # scalar loop, which its compiler may contract into FMAs: those few are held to a few ulps
    # (the 16-bit kernels convert the tail as a partial vector: all bit for bit)
    width = {"AVX512": 16, "AVX2": 8}.get(torch.backends.cpu.get_cpu_capability(), 1)
    for shape, o, f in zip(shapes, ours, fused):
        o, f = o.flatten(), f.flatten()
        tail = o.numel() % width if dtype == torch.float32 else 0
        body = o.numel() - tail
        assert torch.equal(o[:body], f[:body]), (shape, int((o[:body] != f[:body]).sum()), body)
        assert torch.allclose(o[body:], f[body:], rtol=8 * torch.finfo(dtype).eps, atol=0), shape
