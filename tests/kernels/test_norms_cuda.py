"""Triton norm kernels on a real CUDA GPU at real sizes, vs the float64 truth (skipped without a GPU;
`benchmarks/gpu_check.sh` runs these with `-k cuda`)."""
from __future__ import annotations

import pytest
import torch

from kernels.registry import KERNELS, select_provider
from tests.kernels.norm_cases import CASES
from tests.kernels.numerics import DTYPES, make

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

# Each (kernel, dtype, block size, flags) is one Triton JIT compile (~0.5 s): keep the grid small
# enough for gpu_check.sh's budget while covering odd, wide and realistic shapes.
SHAPES = [(17, 4099), (4096, 768), (2, 16384), (2, 3, 7, 64)]
MAIN = ["layer_norm", "rms_norm", "rms_norm_gemma", "add_layer_norm", "add_rms_norm"]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("case", MAIN)
def test_cuda_triton_matches_float64(case: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    CASES[case].check("triton", shape, dtype, device="cuda")


@pytest.mark.parametrize("case", sorted(set(CASES) - set(MAIN)))
def test_cuda_triton_variants(case: str) -> None:
    CASES[case].check("triton", (33, 1000), torch.bfloat16, device="cuda")


@pytest.mark.parametrize("case", ["layer_norm", "rms_norm", "add_rms_norm"])
def test_cuda_triton_non_contiguous(case: str) -> None:
    args = CASES[case].inputs((64, 96), torch.float32, "transposed", device="cuda")
    assert not args[0].is_contiguous()
    CASES[case].check("triton", (64, 96), torch.float32, args=args)


def test_cuda_auto_provider_is_triton() -> None:
    x = make((4, 16), torch.float32).cuda()
    assert select_provider(KERNELS["rms_norm"], (x, None, 1e-6), {})[0] == "triton"
