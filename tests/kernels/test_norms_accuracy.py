"""The CPU norm kernels at inputs that are hard on accuracy (each found by tests/kernels/fuzz.py):
weight gradients summed over many rows, and a large common offset, where how the mean is formed
and kept decides the error of every output and gradient."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels import norms
from tests.kernels.norm_cases import OFFSET_CASES, offset_error_ratios
from tests.kernels.numerics import assert_matches, fwd_bwd, make, max_err, to_f64

pytestmark = pytest.mark.usefixtures("cpu_provider")


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm"])
def test_weight_and_bias_grads_over_many_rows_keep_eagers_accuracy(name: str) -> None:
    """dw/db sum 8192 rows: one fp32 chain per chunk was 7-11x eager's (pairwise) error; rows now
    join a block sum flushed every 32 rows (1.2-2.5x; found by tests/kernels/fuzz.py)."""
    ref = norms.layer_norm_reference if name == "layer_norm" else norms.rms_norm_reference
    for seed in range(2):
        x = make((8192, 64), torch.float32, seed, scale=20.0)
        params = [make((64,), torch.float32, seed + 1)]
        if name == "layer_norm":
            params.append(make((64,), torch.float32, seed + 2))
        args = [x, *params, 1e-5]
        ours = fwd_bwd(lambda *a: getattr(kernels, name)(*a, provider="cpu"), args)
        eager, truth = fwd_bwd(ref, args), fwd_bwd(ref, to_f64(args))
        for i in range(2, 2 + len(params)):  # dw (and db)
            assert max_err(ours[i], truth[i]) <= 4 * max_err(eager[i], truth[i]), (seed, i)


def test_layer_norm_mean_survives_a_large_common_offset() -> None:
    """Values 5 +- 0.01: the row sum's rounding moved the mean by a few ulps of 5, which x - mean
    multiplies by rstd = 100 (outputs 0.65-1.4x eager's error, input grads 1.4-2.6x; found by
    tests/kernels/fuzz.py). The corrected two-pass algorithm adds sum(x - mean) / n back: outputs
    0.3-0.4x eager's error (which has the same rounding), everything within the usual bar."""
    ratios = []
    for seed in range(4):
        x = make((2, 3, 4099), torch.float32, seed, scale=0.01, shift=5.0)
        args = [x, make((4099,), torch.float32, seed + 1), make((4099,), torch.float32, seed + 2), 1e-6]
        ours = fwd_bwd(lambda *a: kernels.layer_norm(*a, provider="cpu"), args)
        eager = fwd_bwd(norms.layer_norm_reference, args)
        truth = fwd_bwd(norms.layer_norm_reference, to_f64(args))
        assert_matches(ours, eager, truth, torch.float32)
        ratios.append(max_err(ours[0], truth[0]) / max_err(eager[0], truth[0]))
    assert max(ratios) < 0.6, ratios


@pytest.mark.parametrize("shape, shift", OFFSET_CASES, ids=str)
def test_layer_norm_keeps_the_mean_in_two_parts(shape: tuple[int, int], shift: float) -> None:
    """Few columns at a large common offset (rstd 60-300): a mean rounded to one float moves every
    x - mean by up to half an ulp of the offset, the whole of the error of y, dx and dw (0.34-0.82x,
    0.9-1.9x and 1.0-2.7x eager's, which rounds its mean too; fuzz seed 14027533 failed on dw). The
    forward and backward take the mean as mu + d with d = sum(x - mu) / n apart: 0.000-0.015x.
    (The Triton provider: test_norms_triton.py.)"""
    assert max(offset_error_ratios("cpu", shape, shift)) <= 0.1


def test_layer_norm_fuzz_seed_14027533() -> None:
    """The fuzzer's case: (2, 16, 3) fp32, values 5 + 0.01 N, x transposed; dw was 2.4x eager's error."""
    from tests.kernels import fuzz

    case = fuzz.draw_case(14027533)
    assert case.kernel == "layer_norm"
    assert case.check() == []


def test_rms_norm_fuzz_seed_34272919() -> None:
    """The fuzzer's case: (2, 7, 33, 1) fp32 x transposed, llama casting: the weight gradient sums
    462 rows of one column whose terms (~1 each) cancel to 0.3. 32-row fp32 block sums gave 15x
    eager's error (5.8e-6); rows that short now flush every row (common.h grad_block_rows): 0.45x."""
    from tests.kernels import fuzz

    case = fuzz.draw_case(34272919)
    assert case.kernel == "rms_norm" and case.describe() == ["(2, 7, 33, 1):float32", "(1,):float32"]
    assert case.check() == []

