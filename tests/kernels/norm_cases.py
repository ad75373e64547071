"""Normalization kernel cases, shared by the CPU tests, the interpreted Triton tests (subprocess)
and the GPU check (`benchmarks/gpu/kernels_check.py`), so all three check the same calls.

A case names a public function, its eager reference, and how to build its arguments for a shape,
dtype, layout and device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

import kernels
from kernels import norms
from tests.kernels.numerics import check_against_reference, make


@dataclass(frozen=True)
class NormCase:
    name: str
    public: str  # function name in `kernels`
    reference: Callable[..., Any]
    residual: bool = False
    weight: bool = True
    bias: bool | None = None  # None: the function has no bias parameter
    offset: float | None = None  # rms: the offset argument (None: not passed)
    eps: float = 1e-5

    def __post_init__(self) -> None:
        if not hasattr(norms, self.public):
            raise ValueError(f"unknown norm function {self.public}")

    def inputs(self, shape: tuple[int, ...], dtype: torch.dtype, layout: str = "contiguous",
               device: str = "cpu", seed: int = 0, param_dtype: torch.dtype | None = None) -> list[Any]:
        """Positional arguments of the public function (weights around 1, or 0 for offset=1);
        weight and bias in `param_dtype` (default: dtype; float32 with a bf16/fp16 x is mixed
        precision)."""
        n = shape[-1]
        pdt = param_dtype or dtype
        x = make(shape, dtype, seed, layout=layout).to(device)
        args: list[Any] = [x]
        if self.residual:
            args.append(make(shape, dtype, seed + 1, layout=layout).to(device))
        w_shift = 0.0 if self.offset else 1.0
        args.append(make((n,), pdt, seed + 2, scale=0.5, shift=w_shift).to(device) if self.weight else None)
        if self.bias is not None:
            args.append(make((n,), pdt, seed + 3, scale=0.5).to(device) if self.bias else None)
        args.append(self.eps)
        if self.offset is not None:
            args.append(self.offset)
        return args

    def ours(self, provider: str | None) -> Callable[..., Any]:
        fn = getattr(kernels, self.public)
        return lambda *args: fn(*args, provider=provider)

    def check(self, provider: str | None, shape: tuple[int, ...], dtype: torch.dtype,
              layout: str = "contiguous", device: str = "cpu", backward: bool = True,
              args: list[Any] | None = None) -> None:
        """ours (poisoned outputs) vs eager vs the float64 truth, forward and backward."""
        args = self.inputs(shape, dtype, layout, device) if args is None else args
        check_against_reference(self.ours(provider), self.reference, args, dtype, backward=backward)


CASES: dict[str, NormCase] = {c.name: c for c in (
    NormCase("layer_norm", "layer_norm", norms.layer_norm_reference, bias=True),
    NormCase("layer_norm_plain", "layer_norm", norms.layer_norm_reference, weight=False, bias=False),
    NormCase("layer_norm_no_bias", "layer_norm", norms.layer_norm_reference, bias=False),
    NormCase("rms_norm", "rms_norm", norms.rms_norm_reference, eps=1e-6),
    NormCase("rms_norm_gemma", "rms_norm", norms.rms_norm_reference, offset=1.0, eps=1e-6),
    NormCase("rms_norm_plain", "rms_norm", norms.rms_norm_reference, weight=False, eps=1e-6),
    NormCase("add_layer_norm", "add_layer_norm", norms.add_layer_norm_reference, residual=True, bias=True),
    NormCase("add_rms_norm", "add_rms_norm", norms.add_rms_norm_reference, residual=True, eps=1e-6),
    NormCase("add_rms_norm_gemma", "add_rms_norm", norms.add_rms_norm_reference, residual=True,
             offset=1.0, eps=1e-6),
)}


def run_interpreted(case_name: str) -> int:
    """All tiny-shape checks of one case through the Triton provider (run with TRITON_INTERPRET=1).

    Returns the number of checks run (each raises AssertionError on a mismatch).
    """
    from tests.kernels.numerics import DTYPES, TINY, with_nonfinite

    case = CASES[case_name]
    count = 0
    for dtype in DTYPES:
        for shape in TINY:
            case.check("triton", shape, dtype)
            count += 1
    case.check("triton", (5, 7), torch.float32, layout="transposed")
    case.check("triton", (3, 40), torch.bfloat16, args=case.inputs((3, 40), torch.bfloat16, param_dtype=torch.float32))
    args = case.inputs((3, 6), torch.float32)
    args[0] = with_nonfinite(args[0])
    case.check("triton", (3, 6), torch.float32, args=args, backward=False)
    return count + 3


def run_cpu_streaming() -> int:
    """CPU checks with every output streamed (run with FUSIONLENS_CPU_STREAM_BYTES=0): the
    non-temporal store path, its column tiles (N > 1024) and unaligned row starts."""
    from tests.kernels.numerics import DTYPES

    count = 0
    for name in ("layer_norm", "rms_norm", "add_layer_norm", "add_rms_norm", "rms_norm_plain"):
        for dtype in DTYPES:
            for shape in ((5, 2051), (3, 17)):
                CASES[name].check("cpu", shape, dtype)
                count += 1
    for name in ("rms_norm", "add_rms_norm"):  # fp32 weight on 16-bit rows: llama's fp32 output streamed
        for dtype in (torch.bfloat16, torch.float16):
            for shape in ((5, 2051), (3, 17)):
                c = CASES[name]
                c.check("cpu", shape, dtype, args=c.inputs(shape, dtype, param_dtype=torch.float32))
                count += 1
    return count


# (shape, offset) of LayerNorm inputs x = offset + 0.01 N with few columns: rstd 60-300, where a
# mean rounded to one float moves every x - mean by up to half an ulp of the offset.
OFFSET_CASES = (((32, 3), 5.0), ((64, 5), 5.0), ((512, 7), 100.0))


def offset_error_ratios(provider: str, shape: tuple[int, int], shift: float, seeds: int = 6) -> list[float]:
    """Worst over `seeds` of ours' error against float64 over eager's, for y, dx and dw of
    layer_norm at a large common offset (fp32). db, the sum of dy, has no mean in it."""
    from tests.kernels.numerics import fwd_bwd, max_err, to_f64

    n, worst = shape[-1], [0.0, 0.0, 0.0]
    for seed in range(seeds):
        args = [make(shape, torch.float32, seed, scale=0.01, shift=shift), make((n,), torch.float32, seed + 1),
                make((n,), torch.float32, seed + 2), 1e-5]
        ours = fwd_bwd(lambda *a: kernels.layer_norm(*a, provider=provider), args)
        eager = fwd_bwd(norms.layer_norm_reference, args)
        truth = fwd_bwd(norms.layer_norm_reference, to_f64(args))
        for i in range(3):
            worst[i] = max(worst[i], max_err(ours[i], truth[i]) / max(max_err(eager[i], truth[i]), 1e-30))
    return worst
