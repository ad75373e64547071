"""Make Triton's CPU interpreter round fp32 -> bf16 the way the GPU does.

Triton 3.7's interpreter converts fp32 to bf16 by dropping the low 16 bits (`cast_impl` hands
`_convert_float` no rounding mode): round toward zero, up to 1 ulp off (2^-7 relative). Compiled
for sm_80+, the same `.to(tl.bfloat16)` (and a bf16 store of an fp32 value) is LLVM's fptrunc,
`cvt.rn.bf16.f32`: round to nearest even, half an ulp at most. Judged against eager's error, the
truncation alone makes bf16 outputs fail by 2-4x (found by `tests.kernels.fuzz --provider triton`,
seeds 50000122, 50000215, ...), so interpreted runs install this first: fp32 -> bf16 goes through
torch's conversion (round to nearest even, NaN kept NaN), and bf16 -> fp32 is the exact widening
(the interpreter turns subnormal bf16 values into 0 or wrong ones); every other cast is the
interpreter's.
"""
from __future__ import annotations

import numpy as np
import torch


def install(approximate: bool = False) -> None:
    """Patch the interpreter's casts (idempotent), and with `approximate` its fp32 math too
    (install_approximate_math). Call before running interpreted kernels."""
    import triton.language as tl
    from triton.runtime import interpreter

    if approximate:
        install_approximate_math()
    builder = interpreter.InterpreterBuilder
    if getattr(builder.cast_impl, "rounds_to_nearest", False):
        return
    truncating = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            f32 = np.array(src.data, dtype=np.float32)  # a contiguous copy; a 0-d value stays 0-d
            bits = torch.from_numpy(f32).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
            return interpreter.TensorHandle(bits, dst_type.scalar)
        if src.dtype.scalar == tl.bfloat16 and dst_type.scalar == tl.float32:  # exact: the bits, shifted
            bits = np.array(src.data, dtype=np.uint16).astype(np.uint32) << np.uint32(16)
            return interpreter.TensorHandle(np.asarray(bits).view(np.float32), dst_type.scalar)
        return truncating(self, src, dst_type)

    cast_impl.rounds_to_nearest = True
    cast_impl.__wrapped__ = truncating  # the interpreter's own (tests show it truncates)
    builder.cast_impl = cast_impl
    # fp_trunc and the other create_* casts are lambdas that look cast_impl up on self: patched too


# What sm_90 compiles the kernels' fp32 math to (the PTX of every variant `tests/kernels/triton_aot.py`
# compiles, 2026-12-05): `a / b` is div.full.f32 (2 ulp at most, PTX ISA), `tl.sqrt`
# sqrt.approx(.ftz).f32 (3 ulp: the OpenCL bound NVIDIA cites for it; an early GPU gave 120.000008
# for sqrt(14400)), `tl.exp(x)` ex2.approx(.ftz).f32 (2 ulp) of x * log2(e) rounded to fp32 first (so
# exp's relative error grows with |x|), `tl.log` lg2.approx.f32 times ln 2. Only `tl.math.div_rn` /
# `sqrt_rn` are IEEE.
APPROX_ULPS = {"div": 2, "sqrt": 3, "ex2": 2, "lg2": 2}
_LOG2E, _LN2 = np.float32(1.4426950408889634), np.float32(0.6931471805599453)


def _off_by_ulps(y: np.ndarray, exact, ulps: int) -> np.ndarray:
    """fp32 y moved `ulps` units away from zero wherever it is a normal number and not exact (the
    worst the GPU's approximate instruction may return, in the same direction everywhere: a bias,
    the hardest case for sums). `exact`: where it is True, the result is one the hardware returns
    exactly (2^0 = 1, x / 4) and stays; zeros, subnormals, Inf and NaN stay too."""
    y = np.asarray(y)
    if y.dtype != np.float32 or ulps == 0:
        return y
    bits = y.view(np.int32)
    mag = bits & np.int32(0x7FFFFFFF)
    moved = (mag >= np.int32(0x00800000)) & (mag < np.int32(0x7F800000 - ulps)) & ~np.asarray(exact, dtype=bool)
    return np.where(moved, (bits + np.int32(ulps)).view(np.float32), y)  # sign-magnitude: + is away from 0


def install_approximate_math(ulps: dict[str, int] | None = None) -> None:
    """Make the interpreter's fp32 division, sqrt, exp and log as inexact as the GPU's instructions
    may be (APPROX_ULPS, every inexact result off by the most, away from zero), so that a kernel
    judged against eager's error here is judged with the error it will have compiled (idempotent:
    each call sets the same functions; `install(approximate=True)` calls it)."""
    from triton.runtime import interpreter

    u = dict(APPROX_ULPS, **(ulps or {}))
    builder = interpreter.InterpreterBuilder

    def fp32(op):
        def run(self, *args):
            out = np.asarray(op(*(a.data for a in args)))
            dtype = interpreter._get_np_dtype(args[0].dtype.scalar)
            return interpreter.TensorHandle(out if out.dtype == dtype else out.astype(dtype), args[0].dtype.scalar)
        return run

    def approx(fn, ulps, exact_when=None):
        """fn in fp32 (numpy's, correctly rounded), then off by `ulps` except where exact_when(args,
        y) holds (default: never: sqrt.approx may miss even a perfect square)."""
        def run(*args):
            y = fn(*args)
            if y.dtype != np.float32:
                return y
            with np.errstate(all="ignore"):
                exact = exact_when(args, y) if exact_when else False
            return _off_by_ulps(y, exact, ulps)
        return run

    def representable(fn64):  # the float64 result is y: exact in fp32 (ex2 of an integer, lg2 of 2^k)
        return lambda args, y: np.asarray(y, dtype=np.float64) == fn64(*(np.asarray(a, dtype=np.float64) for a in args))

    def divisor_power_of_two(args, y):  # rcp.approx of 2^k is exact, so a / 2^k rounds as a product
        mantissa, _ = np.frexp(np.asarray(args[1], dtype=np.float64))
        return np.abs(mantissa) == 0.5

    div = approx(np.divide, u["div"], divisor_power_of_two)
    sqrt = approx(np.sqrt, u["sqrt"])
    exp2 = approx(np.exp2, u["ex2"], representable(np.exp2))
    log2 = approx(np.log2, u["lg2"], representable(np.log2))

    def exp(a):  # ex2.approx of x * log2(e), the product rounded to fp32 first
        return exp2((a * _LOG2E).astype(np.float32)) if a.dtype == np.float32 else np.exp(a)

    def log(a):  # lg2.approx, times ln 2
        return (log2(a) * _LN2).astype(np.float32) if a.dtype == np.float32 else np.log(a)

    builder.create_fdiv = fp32(div)
    builder.create_sqrt = fp32(sqrt)
    builder.create_exp = fp32(exp)
    builder.create_exp2 = fp32(exp2)
    builder.create_log = fp32(log)
