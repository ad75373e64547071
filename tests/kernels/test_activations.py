"""GELU, bias + GELU, SwiGLU, GeGLU: the cpu provider vs the float64 truth (forward and backward),
judged by eager's own error; awkward shapes, batch dims, non-contiguous, NaN/Inf, zero-size,
poisoned outputs; provider fallbacks, costs, modules; Triton under the interpreter (subprocess)."""
from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

import kernels
from kernels import activations as act
from kernels.registry import KERNELS, select_provider
from tests.kernels.numerics import (AWKWARD_2D, BATCHED, DTYPES, TINY, OpNames, bits, check_against_reference, fwd_bwd,
                                    make, max_err, run_in_triton_interpreter, to_f64, with_nonfinite)

# name -> (public fn taking provider=, reference, has_bias, gated, kwargs)
CASES = {
    "gelu": (kernels.gelu, act.gelu_reference, False, False, {}),
    "gelu_tanh": (kernels.gelu, act.gelu_reference, False, False, {"approximate": "tanh"}),
    "bias_gelu": (kernels.bias_gelu, act.bias_gelu_reference, True, False, {}),
    "bias_gelu_tanh": (kernels.bias_gelu, act.bias_gelu_reference, True, False, {"approximate": "tanh"}),
    "swiglu": (kernels.swiglu, act.swiglu_reference, False, True, {}),
    "geglu": (kernels.geglu, act.geglu_reference, False, True, {}),
    "geglu_tanh": (kernels.geglu, act.geglu_reference, False, True, {"approximate": "tanh"}),
}


def inputs(case: str, shape, dtype, layout: str = "contiguous") -> list[torch.Tensor]:
    _, _, has_bias, gated, _ = CASES[case]
    x = make(shape, dtype, seed=1, scale=2.0, layout=layout)
    if has_bias:
        return [x, make((shape[-1],), dtype, seed=2)]
    if gated:
        return [x, make(shape, dtype, seed=3, layout=layout)]
    return [x]


def check(case: str, provider: str, args, dtype, backward: bool = True) -> None:
    fn, reference, _, _, kwargs = CASES[case]
    check_against_reference(lambda *a, **k: fn(*a, **k, provider=provider), reference, args, dtype,
                            backward=backward, **kwargs)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", AWKWARD_2D + BATCHED, ids=str)
@pytest.mark.parametrize("case", sorted(CASES))
def test_matches_float64(case: str, shape, dtype) -> None:
    check(case, "cpu", inputs(case, shape, dtype), dtype)


@pytest.mark.parametrize("layout", ["transposed", "strided"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_non_contiguous(case: str, layout: str) -> None:
    check(case, "cpu", inputs(case, (9, 130), torch.float32, layout), torch.float32)


def _halves(shape, dtype, seed: int = 4, transpose_batch: bool = False) -> list[torch.Tensor]:
    """a, b as the gate and up halves of one [..., 2n] projection (`h.chunk(2, -1)`): views with
    a unit last stride and a row stride of 2n."""
    h = make(tuple(shape[:-1]) + (2 * shape[-1],), dtype, seed=seed, scale=2.0)
    if transpose_batch:  # leading dims that do not collapse into one row stride
        h = h.transpose(0, 1)
    return list(h.chunk(2, -1))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (3, 5), (17, 4099), (2, 3, 33), (64, 1024)], ids=str)
@pytest.mark.parametrize("case", ["swiglu", "geglu", "geglu_tanh"])
def test_gated_halves_of_one_projection(case: str, shape, dtype) -> None:
    """The C++ kernels read row-strided halves in place (fwd and bwd), against float64."""
    a, b = _halves(shape, dtype)
    check(case, "cpu", [a, b], dtype)


@pytest.mark.parametrize("case", ["swiglu", "geglu"])
def test_halves_whose_rows_do_not_collapse_are_copied(case: str) -> None:
    a, b = _halves((4, 6, 40), torch.float32, transpose_batch=True)
    with pytest.raises(RuntimeError):
        a.view(-1, 40)
    check(case, "cpu", [a, b], torch.float32)


@pytest.mark.parametrize("grad", [False, True], ids=["infer", "train"])
def test_gated_halves_are_not_copied(grad: bool) -> None:
    """No aten copy in the forward: before, both halves were made contiguous (two extra passes)."""
    h = make((64, 2 * 256), torch.float32).requires_grad_(grad)
    a, b = h.chunk(2, -1)
    with OpNames() as ops:
        y = kernels.swiglu(a, b, provider="cpu")
    assert "fusionlens.glu_fwd.default" in ops.seen
    assert not [op for op in ops.seen if "copy" in op or "clone" in op], ops.seen
    torch.testing.assert_close(y, F.silu(a) * b)


@pytest.mark.parametrize("case", sorted(CASES))
def test_nan_inf_propagate_like_reference(case: str) -> None:
    args = inputs(case, (4, 37), torch.float32)
    args[0] = with_nonfinite(args[0])
    check(case, "cpu", args, torch.float32)


def test_gelu_of_inf_follows_the_float64_truth() -> None:
    # eager fp32 F.gelu(+inf) is NaN (its vectorized erf), the math (and float64) says +inf.
    x = torch.tensor([float("inf"), float("-inf"), 3.0])
    y = kernels.gelu(x, provider="cpu")
    assert y[0] == float("inf") and torch.isnan(y[1]) and torch.isclose(y[2], F.gelu(x[2:]))[0]


# Shapes that hit the 16/8/4-wide vector loops and their scalar tails (83 = 5*16 + 3), several
# 1024-element chunks with a ragged last one (4117), and the bias path's row loop.
ISA_SHAPES = ((9, 83), (5, 4117))


@pytest.mark.parametrize("isa", ["avx512", "avx2", "base"])
def test_every_instruction_set_copy_matches_float64(isa: str, monkeypatch) -> None:
    """activations.cpp compiles its loops once per instruction set, picked at run time;
    FUSIONLENS_CPU_ISA lowers the pick, so every copy this CPU can run is checked here."""
    monkeypatch.setenv("FUSIONLENS_CPU_ISA", isa)
    kernels.gelu(torch.zeros(1), provider="cpu")  # builds/loads the extension
    order = ["base", "avx2", "avx512"]
    assert order.index(torch.ops.fusionlens.activations_isa()) <= order.index(isa)
    for case in sorted(CASES):
        for dtype in (torch.float32, torch.bfloat16):
            for shape in ISA_SHAPES:
                check(case, "cpu", inputs(case, shape, dtype), dtype)
    args = inputs("gelu", (4, 37), torch.float32)
    check("gelu", "cpu", [with_nonfinite(args[0])], torch.float32)


@pytest.mark.parametrize("case", sorted(CASES))
def test_avx512_and_avx2_copies_agree_bit_for_bit(case: str, monkeypatch) -> None:
    """The two vector copies do the same operations (multiply-adds contracted alike, the same exp
    and selects in other instructions), so their outputs and gradients are the same bits, on every
    dtype and with non-finite inputs: a change made in one copy's code only (FL_ISA branches) must
    keep it so. (The base copy has no FMA: it rounds differently, and is checked against float64.)"""
    kernels.gelu(torch.zeros(1), provider="cpu")  # builds/loads the extension
    if torch.ops.fusionlens.activations_isa() != "avx512":
        pytest.skip("this CPU has no AVX-512: only one vector copy runs here")
    fn, _, _, _, kwargs = CASES[case]
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for shape in ISA_SHAPES:
                args = inputs(case, shape, dtype)
                args[0] = with_nonfinite(args[0])
                got = {}
                for isa in ("avx512", "avx2"):
                    monkeypatch.setenv("FUSIONLENS_CPU_ISA", isa)
                    got[isa] = [bits(t) for t in fwd_bwd(lambda *a: fn(*a, **kwargs, provider="cpu"), args)]
                for i, (a, b) in enumerate(zip(got["avx512"], got["avx2"])):
                    assert torch.equal(a, b), (case, dtype, shape, i, int((a != b).sum()))
    finally:
        torch.set_num_threads(prev)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("shape", [(0, 5), (3, 0)], ids=str)
def test_zero_size(case: str, shape) -> None:
    check(case, "cpu", inputs(case, shape, torch.float32), torch.float32)


@pytest.mark.parametrize("threads", [1, 2])
def test_bias_grad_reduced_over_many_rows(threads: int) -> None:
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        check("bias_gelu", "cpu", inputs("bias_gelu", (3001, 24), torch.float32), torch.float32)
    finally:
        torch.set_num_threads(prev)


@pytest.mark.parametrize("seed", [0, 1])
def test_bias_grad_sums_rows_in_blocks_as_accurately_as_eager(seed: int) -> None:
    """Over 4096 rows one fp32 chain per column was 5-8x eager's (pairwise) error in the bias
    gradient while the input gradient matched eager's (found by tests/kernels/fuzz.py); rows are now
    summed in blocks of 32, then the blocks. The bar: 2.5x eager's error + 2 ulps of the result."""
    x, b = make((4096, 768), torch.float32, seed), make((768,), torch.float32, seed + 100)
    ref = KERNELS["bias_gelu"].reference
    ours = fwd_bwd(lambda x, b: kernels.bias_gelu(x, b, provider="cpu"), [x, b])[2]
    eager, truth = fwd_bwd(ref, [x, b])[2], fwd_bwd(ref, to_f64([x, b]))[2]
    bar = 2.5 * max_err(eager, truth) + 2 * torch.finfo(torch.float32).eps * float(truth.abs().max())
    assert max_err(ours, truth) <= bar


def test_bias_gelu_tanh_gradient_where_the_sigmoid_saturates() -> None:
    """x = 5 + 0.01 N, a bias, 1089 rows (fuzz seed 744072): tanh-GELU's derivative took 1 - s as a
    difference where s = sigmoid(2u) rounds near 1, 0 or 2^-24 against 4.6e-8, a one-signed error
    in every element that the bias gradient summed to 3x eager's error. Now 1 - s is sigmoid(-2u)."""
    x, b = make((33, 1, 33, 8), torch.float32, 1, scale=0.01, shift=5.0), make((8,), torch.float32, 2)
    check("bias_gelu_tanh", "cpu", [x, b], torch.float32)
    ref = KERNELS["bias_gelu"].reference
    ours = fwd_bwd(lambda x, b: kernels.bias_gelu(x, b, approximate="tanh", provider="cpu"), [x, b])
    eager = fwd_bwd(lambda x, b: ref(x, b, approximate="tanh"), [x, b])
    truth = fwd_bwd(lambda x, b: ref(x, b, approximate="tanh"), to_f64([x, b]))
    for i in (1, 2):  # the input and the bias gradients: at most eager's error (they were 2x and 3x)
        assert max_err(ours[i], truth[i]) <= max_err(eager[i], truth[i])


# case -> an input offset where its sigmoid rounds to 1 or one ulp below (SiLU past ~17, tanh-GELU past ~4)
SATURATING = {"gelu_tanh": 5.0, "swiglu": 18.0}


def _check_saturated(case: str, shift: float, provider: str, shape=(64, 97), factor: float = 0.5) -> None:
    """The gradient through the activation within `factor` x eager's own error of float64 (ours
    takes 1 - s as sigmoid(-z): ~4x more accurate than eager's 1 - s and 1 - tanh^2 at these
    inputs; the old formulas equalled eager's), any other input gradient within eager's."""
    fn, reference, _, gated, kwargs = CASES[case]
    x = make(shape, torch.float32, 3, scale=0.5, shift=shift)
    args = [x, make(shape, torch.float32, 4)] if gated else [x]
    ours = fwd_bwd(lambda *a: fn(*a, **kwargs, provider=provider), args)
    eager = fwd_bwd(lambda *a: reference(*a, **kwargs), args)
    truth = fwd_bwd(lambda *a: reference(*a, **kwargs), to_f64(args))
    for i in range(1, len(ours)):  # the input gradients (ours[0] is the output; ours[1] through act')
        bar = factor if i == 1 else 1.01
        assert max_err(ours[i], truth[i]) <= max_err(eager[i], truth[i]) * bar, (case, provider, i)


@pytest.mark.parametrize("case, shift, factor", [("gelu_tanh", 5.0, 0.5), ("gelu_tanh", 9.0, 1.01),
                                                  ("swiglu", 18.0, 0.5)])
def test_derivative_where_the_sigmoid_saturates_beats_eager(case: str, shift: float, factor: float) -> None:
    """Inputs where sigmoid rounds to 1 or one ulp below (at 9, exactly 1 in every formula: equal
    to eager's there): the cpu provider (the Triton provider's run in `run_interpreted`)."""
    _check_saturated(case, shift, "cpu", factor=factor)


def test_inference_path_without_grad_matches() -> None:
    x, b = inputs("bias_gelu", (5, 300), torch.float32)
    with torch.no_grad():
        y = kernels.bias_gelu(x, b, provider="cpu")
    torch.testing.assert_close(y, F.gelu(x.double() + b.double()).float(), rtol=1e-5, atol=1e-6)


def test_auto_provider_is_cpu_and_fallbacks_keep_reasons() -> None:
    x, b = torch.randn(4, 8), torch.randn(8)
    assert select_provider(KERNELS["bias_gelu"], (x, b, "none"), {})[0] == "cpu"
    chosen, skipped = select_provider(KERNELS["bias_gelu"], (x, b.double(), "none"), {})
    assert chosen == "reference" and "mixed dtypes" in skipped["cpu"]
    chosen, skipped = select_provider(KERNELS["swiglu"], (x, torch.randn(1, 8)), {})
    assert chosen == "reference" and "same shape" in skipped["cpu"]
    # the fallback still computes the reference's answer (broadcasting b)
    torch.testing.assert_close(kernels.swiglu(x, torch.ones(1, 8)), F.silu(x))


def test_bad_approximate_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="approximate must be"):
        kernels.gelu(torch.randn(3), approximate="fast")


def test_costs_count_the_intermediates_eager_writes() -> None:
    x, b = torch.randn(4096, 768), torch.randn(768)
    n, e = x.numel(), 4
    c = KERNELS["bias_gelu"].cost(x, b, "none")
    assert (c.bytes_fused, c.bytes_unfused) == (2 * n * e + 768 * e, 4 * n * e + 768 * e)
    c = KERNELS["swiglu"].cost(x, x)
    assert (c.bytes_fused, c.bytes_unfused, c.bytes_saved) == (3 * n * e, 5 * n * e, 2 * n * e)
    assert KERNELS["gelu"].cost(x.half()).bytes_fused == 2 * n * 2


def test_modules() -> None:
    x = torch.randn(3, 10, requires_grad=True)
    torch.testing.assert_close(act.GELU("tanh")(x), F.gelu(x, approximate="tanh"))
    m = act.BiasGELU(10)
    torch.testing.assert_close(m(x), F.gelu(x))
    m(x).sum().backward()
    assert m.bias.grad is not None and m.bias.grad.shape == (10,)
    a, b = x.chunk(2, dim=-1)
    torch.testing.assert_close(act.SwiGLU()(x), F.silu(a) * b)
    torch.testing.assert_close(act.GeGLU()(x), F.gelu(a) * b)
    assert repr(act.GELU("tanh")) == "GELU(approximate='tanh', provider=None)"  # as nn.GELU's says it
    assert "approximate='tanh'" in repr(act.GeGLU("tanh")) and "features=10" in repr(act.BiasGELU(10))
    # factory kwargs as torch's modules take them (models built on meta, in bf16)
    assert act.BiasGELU(10, device="meta").bias.device.type == "meta"
    assert act.BiasGELU(10, dtype=torch.bfloat16).bias.dtype == torch.bfloat16


def run_interpreted() -> int:
    """Every case through the Triton provider at tiny sizes (run with TRITON_INTERPRET=1)."""
    count = 0
    for case in sorted(CASES):
        for dtype in DTYPES:
            for shape in TINY:
                check(case, "triton", inputs(case, shape, dtype), dtype)
                count += 1
        check(case, "triton", inputs(case, (5, 7), torch.float32, "transposed"), torch.float32)
        args = inputs(case, (3, 6), torch.float32)
        args[0] = with_nonfinite(args[0])
        check(case, "triton", args, torch.float32)
        check(case, "triton", inputs(case, (0, 4), torch.float32), torch.float32)
        count += 3
        if case in SATURATING:  # where the sigmoid rounds near 1: input gradients within eager's error
            _check_saturated(case, SATURATING[case], "triton")
            count += 1
        if CASES[case][3]:  # gated: the row-strided halves of one projection, read in place
            for dtype in DTYPES:
                check(case, "triton", _halves((9, 33), dtype), dtype)
            check(case, "triton", _halves((2, 3, 17), torch.float32, transpose_batch=True), torch.float32)
            count += len(DTYPES) + 1
    return count


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA GPU present: compiled Triton is checked at real sizes by test_cuda_*")
def test_triton_interpreted() -> None:
    out = run_in_triton_interpreter(
        "from tests.kernels.test_activations import run_interpreted\nprint(run_interpreted())")
    gated = sum(1 for case in CASES.values() if case[3])
    assert int(out.strip().splitlines()[-1]) == (len(CASES) * (len(DTYPES) * len(TINY) + 3) + gated * (len(DTYPES) + 1)
                                                 + len(SATURATING))


def test_explicit_triton_without_gpu_or_interpreter_raises_with_reason(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present")
    with pytest.raises(ValueError, match="provider 'triton' unavailable"):
        kernels.swiglu(torch.randn(2, 3), torch.randn(2, 3), provider="triton")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
def test_cuda_triton_activations_real_sizes() -> None:
    from benchmarks.kernels.activations import gpu_checks

    for _, check in gpu_checks("cuda"):
        check()
