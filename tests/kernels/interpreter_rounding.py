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


def install() -> None:
    """Patch the interpreter's cast (idempotent). Call before running interpreted kernels."""
    import triton.language as tl
    from triton.runtime import interpreter

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
            return interpreter.TensorHandle(bits.view(np.float32), dst_type.scalar)
        return truncating(self, src, dst_type)

    cast_impl.rounds_to_nearest = True
    cast_impl.__wrapped__ = truncating  # the interpreter's own (tests show it truncates)
    builder.cast_impl = cast_impl
    # fp_trunc and the other create_* casts are lambdas that look cast_impl up on self: patched too
