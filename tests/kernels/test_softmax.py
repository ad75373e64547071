"""Scaled / masked / causal softmax: the cpu provider vs the float64 truth (forward and backward,
including the mask's gradient), judged by eager's own error; awkward shapes, broadcast masks,
fully masked rows, dim != -1, non-contiguous, NaN/Inf, zero-size, poisoned outputs; provider
fallbacks, costs, module; Triton under the interpreter (subprocess)."""
from __future__ import annotations

import importlib.util

import pytest
import torch

import kernels
from kernels.registry import KERNELS, select_provider
from tests.kernels.numerics import (AWKWARD_2D, BATCHED, DTYPES, check_against_reference, make,
                                    run_in_triton_interpreter, with_nonfinite)
sm = importlib.import_module("kernels.softmax")  # the module; `kernels.softmax` is the function

NINF = float("-inf")


def ours(provider: str, **kw):
    return lambda x, *mask: kernels.softmax(x, mask=mask[0] if mask else None, provider=provider, **kw)


def reference(**kw):
    return lambda x, *mask: sm.softmax_reference(x, mask=mask[0] if mask else None, **kw)


def check(provider: str, args, dtype, backward: bool = True, **kw) -> None:
    check_against_reference(ours(provider, **kw), reference(**kw), args, dtype, backward=backward)


def padding_mask(batch: int, sk: int, dtype, seed: int = 5) -> torch.Tensor:
    """[B, 1, 1, S_k] additive mask: random values, the last 1..3 keys of each batch at -inf."""
    m = make((batch, 1, 1, sk), dtype, seed=seed)
    for b in range(batch):
        m[b, ..., sk - 1 - (b % 3):] = NINF
    return m


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", AWKWARD_2D + BATCHED, ids=str)
def test_plain_and_scaled_match_float64(shape, dtype) -> None:
    x = make(shape, dtype, seed=1, scale=3.0)
    check("cpu", [x], dtype)
    check("cpu", [x], dtype, scale=0.125)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (1, 2, 1, 4099), (3, 2, 17, 33)], ids=str)
def test_padding_mask_with_grad(shape, dtype) -> None:
    x = make(shape, dtype, seed=1, scale=2.0)
    check("cpu", [x, padding_mask(shape[0], shape[-1], dtype)], dtype, scale=0.5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_square_mask_without_grad(dtype) -> None:
    x = make((2, 3, 9, 9), dtype, seed=1)
    mask = make((9, 9), dtype, seed=7)
    kw = dict(scale=0.3, mask=mask)
    check_against_reference(lambda x: kernels.softmax(x, provider="cpu", **kw),
                            lambda x: sm.softmax_reference(x, **kw), [x], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sq,sk", [(7, 7), (3, 10), (1, 4099), (33, 64)], ids=str)
def test_causal(sq: int, sk: int, dtype) -> None:
    x = make((2, 3, sq, sk), dtype, seed=1, scale=2.0)
    check("cpu", [x], dtype, causal=True, scale=0.25)
    check("cpu", [x, padding_mask(2, sk, dtype)], dtype, causal=True)


def test_fully_masked_rows_behave_like_eager() -> None:
    # causal with S_q > S_k: the first rows see no key -> NaN forward, zero gradient (masked_fill)
    x = make((2, 6, 4), torch.float32, seed=1)
    check("cpu", [x], torch.float32, causal=True)
    y = kernels.softmax(x, causal=True, provider="cpu")
    assert torch.isnan(y[:, :2]).all() and not torch.isnan(y[:, 2:]).any()
    # an additive mask of all -inf on a row: NaN forward and NaN gradient, as eager gives
    mask = torch.zeros(6, 4)
    mask[3] = NINF
    check("cpu", [x, mask], torch.float32)


def test_one_d_and_single_key() -> None:
    check("cpu", [make((11,), torch.float32, seed=1)], torch.float32, scale=2.0)
    check("cpu", [make((11,), torch.float32, seed=1)], torch.float32, causal=True)
    check("cpu", [make((5, 1), torch.float32, seed=1)], torch.float32, causal=True)


@pytest.mark.parametrize("dim", [0, 1, -2])
def test_other_dims(dim: int) -> None:
    x = make((5, 6, 7), torch.float32, seed=1)
    check("cpu", [x], torch.float32, dim=dim, scale=1.5)
    check("cpu", [x, make((1, 6, 7), torch.float32, seed=2)], torch.float32, dim=dim)


@pytest.mark.parametrize("provider", ["cpu", "reference"])
def test_other_dim_with_a_mask_over_a_last_dim_of_one(provider: str) -> None:
    """Found by the fuzzer (tests/kernels/fuzz.py): moving dim 0 last leaves the mask's new last
    dim of size 1 with a stride torch ignores (so .contiguous() kept it), and the kernel refused."""
    x = make((1, 1, 8), torch.float16, seed=1)  # softmax over a dim of size 1
    check(provider, [x, make((1, 8), torch.float16, seed=2)], torch.float16, dim=0, scale=0.125)


@pytest.mark.parametrize("provider", ["cpu", "reference"])
@pytest.mark.parametrize("shape, dim, mshape", [((0, 3, 2, 65), -3, (3, 1, 65)), ((33, 0, 33), 0, (1, 33))])
def test_other_dim_with_a_mask_on_a_zero_size_input(provider: str, shape, dim, mshape) -> None:
    """Found by the fuzzer: with no elements at all, the moved mask's last dim kept a stride != 1
    (torch calls any empty view contiguous), and the kernel refused it."""
    check(provider, [make(shape, torch.float32, seed=1), make(mshape, torch.float32, seed=2)], torch.float32,
          dim=dim)


@pytest.mark.parametrize("layout", ["transposed", "strided"])
def test_non_contiguous(layout: str) -> None:
    x = make((3, 5, 130), torch.float32, seed=1, layout=layout)
    check("cpu", [x, make((3, 1, 130), torch.float32, seed=2, layout=layout)], torch.float32, scale=0.7)


def test_nan_inf_propagate_like_reference() -> None:
    x = with_nonfinite(make((4, 37), torch.float32, seed=1))
    check("cpu", [x], torch.float32)
    check("cpu", [x], torch.float32, causal=True)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "base"])
def test_every_instruction_set_copy_matches_float64(isa: str, monkeypatch) -> None:
    """softmax.cpp compiles its row loops once per instruction set, picked at run time;
    FUSIONLENS_CPU_ISA lowers the pick, so every copy this CPU can run is checked here
    (rows of 83 = 5*16 + 3 and 4117 hit the vector loops and their scalar tails)."""
    monkeypatch.setenv("FUSIONLENS_CPU_ISA", isa)
    kernels.softmax(torch.zeros(1), provider="cpu")  # builds/loads the extension
    order = ["base", "avx2", "avx512"]
    assert order.index(torch.ops.fusionlens.softmax_isa()) <= order.index(isa)
    for dtype in (torch.float32, torch.bfloat16):
        check("cpu", [make((9, 83), dtype, seed=1, scale=3.0)], dtype, scale=0.5)
        check("cpu", [make((2, 3, 2, 4117), dtype, seed=2, scale=3.0), padding_mask(2, 4117, dtype)], dtype)
        check("cpu", [make((2, 7, 83), dtype, seed=3)], dtype, causal=True)


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (2, 0, 4)], ids=str)
def test_zero_size(shape) -> None:
    check("cpu", [make(shape, torch.float32, seed=1)], torch.float32)
    check("cpu", [make(shape, torch.float32, seed=1)], torch.float32, causal=True)


def test_bad_input_one_clear_error() -> None:
    x = torch.randn(2, 4, 4)
    with pytest.raises(TypeError, match="boolean keep-mask"):
        kernels.softmax(x, mask=torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="needs dim=-1"):
        kernels.softmax(x, dim=0, causal=True)
    with pytest.raises(IndexError, match="out of range"):
        kernels.softmax(x, dim=3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 5, 7), (1, 2, 3, 4099)], ids=str)
def test_fp32_mask_on_low_precision_scores_promotes_like_eager(shape, dtype) -> None:
    """HF-style fp32 masks on bf16/fp16 scores: eager gives fp32 probabilities; so do we (fused,
    gradients to the scores and the mask included), causal too; a bf16 mask on fp32 scores keeps fp32."""
    x = make(shape, dtype, seed=1, scale=2.0)
    mask = padding_mask(shape[0], shape[-1], torch.float32)
    check("cpu", [x, mask], dtype, scale=0.5)
    check("cpu", [x, mask], dtype, causal=True)
    assert kernels.softmax(x, mask=mask, provider="cpu").dtype == torch.float32
    assert select_provider(KERNELS["softmax"], (x, -1, 0.5, mask, False), {})[0] == "cpu"
    x32 = make(shape, torch.float32, seed=1, scale=2.0)
    check("cpu", [x32, padding_mask(shape[0], shape[-1], dtype)], torch.float32, scale=0.5)


def test_auto_provider_and_fallback_reasons() -> None:
    x = torch.randn(2, 4, 4)
    assert select_provider(KERNELS["softmax"], (x, -1, 1.0, None, False), {})[0] == "cpu"
    chosen, skipped = select_provider(KERNELS["softmax"], (x, -1, 1.0, torch.zeros(4, 4, dtype=torch.float64), False), {})
    assert chosen == "reference" and "dtype" in skipped["cpu"] and "dtype" in skipped["aten"]
    chosen, skipped = select_provider(KERNELS["softmax"], (x, -1, 1.0, torch.zeros(3, 1, 4, 4), False), {})
    assert chosen == "reference" and "larger shape" in skipped["cpu"]
    with pytest.raises(ValueError, match="no scale or mask"):
        kernels.softmax(x, scale=2.0, provider="aten")
    torch.testing.assert_close(kernels.softmax(x, provider="aten"), torch.softmax(x, -1))


def test_cost_counts_the_eager_passes() -> None:
    x = torch.randn(8, 12, 64, 64)
    n = x.numel() * 4
    assert KERNELS["softmax"].cost(x, -1, 1.0, None, False).bytes_unfused == 2 * n
    c = KERNELS["softmax"].cost(x, -1, 0.125, None, True)
    assert (c.bytes_fused, c.bytes_unfused) == (2 * n, 6 * n)


def test_module() -> None:
    x = torch.randn(2, 3, 5, 5, requires_grad=True)
    m = sm.Softmax(scale=0.5, causal=True)
    torch.testing.assert_close(m(x), sm.softmax_reference(x, scale=0.5, causal=True))


def run_interpreted() -> int:
    """The same story through the Triton provider at tiny sizes (run with TRITON_INTERPRET=1)."""
    count = 0
    for dtype in DTYPES:
        for shape in [(1, 1), (3, 5), (2, 3, 33), (2, 2, 3, 7)]:
            x = make(shape, dtype, seed=1, scale=2.0)
            check("triton", [x], dtype, scale=0.5)
            check("triton", [x], dtype, causal=True)
            count += 2
        check("triton", [make((2, 2, 3, 9), dtype, seed=1), padding_mask(2, 9, dtype)], dtype, scale=0.5)
        count += 1
    x = make((2, 6, 4), torch.float32, seed=1)
    mask = torch.zeros(6, 4)
    mask[3] = NINF
    check("triton", [x, mask], torch.float32, causal=True)
    check("triton", [make((5, 6, 7), torch.float32, seed=1)], torch.float32, dim=1)
    check("triton", [with_nonfinite(make((4, 37), torch.float32, seed=1))], torch.float32)
    check("triton", [make((0, 5), torch.float32, seed=1)], torch.float32)
    import kernels.triton_softmax as ts  # the multi-tile (online) path, with a tiny tile
    ts.SINGLE_MAX, ts.BLOCK = 8, 4
    check("triton", [make((2, 3, 5, 13), torch.float32, seed=1), padding_mask(2, 13, torch.float32)],
          torch.float32, causal=True, scale=0.5)
    check("triton", [with_nonfinite(make((4, 37), torch.float32, seed=1))], torch.float32)
    check("triton", [make((2, 9, 6), torch.float32, seed=1)], torch.float32, causal=True)
    check("triton", [make((2, 2, 3, 9), torch.bfloat16, seed=1), padding_mask(2, 9, torch.float32)],
          torch.bfloat16, scale=0.5)  # an fp32 mask promotes: fp32 probabilities
    return count + 8


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA GPU present: compiled Triton is checked at real sizes by test_cuda_*")
def test_triton_interpreted() -> None:
    out = run_in_triton_interpreter(
        "from tests.kernels.test_softmax import run_interpreted\nprint(run_interpreted())")
    assert int(out.strip().splitlines()[-1]) == 3 * 9 + 8


def test_public_names_call_even_after_the_submodule_import() -> None:
    # `kernels.softmax` / `kernels.rope` are also submodule names; importing the submodule rebinds
    # the package attribute to the module, which must then still call like the function.
    import importlib

    importlib.import_module("kernels.softmax")
    importlib.import_module("kernels.rope")
    x = torch.randn(2, 3)
    torch.testing.assert_close(kernels.softmax(x, scale=2.0), torch.softmax(2.0 * x, -1))
    q = torch.randn(1, 1, 2, 4)
    c, s = torch.ones(2, 4), torch.zeros(2, 4)
    torch.testing.assert_close(kernels.rope(q, q, c, s)[0], q)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")
def test_cuda_triton_softmax_real_sizes() -> None:
    from benchmarks.kernels.softmax import gpu_checks

    for _, check in gpu_checks("cuda"):
        check()
