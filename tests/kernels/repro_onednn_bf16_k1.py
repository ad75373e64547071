"""Pure-torch reproduction of a heap corruption in torch 2.13's oneDNN (v3.12) on the CPU.

bf16 matmuls whose inner dimension is 1, mixed with bf16 matmuls whose inner dimension is larger,
over enough distinct shapes and layouts that oneDNN's primitive cache evicts, abort with glibc
"corrupted size vs. prev_size" / "double free or corruption" or a segfault, usually within a
few thousand products (1-2 s on the 2-core dev VM, Xeon with AMX). Nothing of FusionLens runs.

Measured 2026-12-03 (each 20,000 products, 1 thread, MALLOC_CHECK_=3):
- k in {1, 2} or {1, 8} or {1, 64}: aborts; k = 1 alone, or k in {2..8} alone: clean;
- fp16 and fp32 with the same shapes: clean;
- ONEDNN_PRIMITIVE_CACHE_CAPACITY=4096 (no evictions): clean; ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16
  (no AMX): still aborts;
- only transposed or only row-major operands: clean.

FusionLens's fused linear cross-entropy met it through a 1-row chunk (dW += G.T @ x[chunk] has
k = 1) and now computes such products as outer products (kernels/linear_cross_entropy._mm). The
fuzzer's eager references still run these matmuls, so `python -m tests.kernels.fuzz` raises the
cache's capacity (see there).

Run: python tests/kernels/repro_onednn_bf16_k1.py [seed] [products]; exit status 0 means the
run was clean (this torch may be fixed), a signal or abort means it still corrupts.
"""
import os
import random
import sys

os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "64")  # evict early; the default 1024 takes longer

import torch  # noqa: E402


def main(seed: int = 0, products: int = 20_000) -> None:
    torch.set_num_threads(1)
    rng = random.Random(seed)

    def operand(rows: int, cols: int) -> torch.Tensor:
        if rng.random() < 0.5:
            return torch.randn(rows, cols).bfloat16()
        return torch.randn(cols, rows).bfloat16().t()  # column-major

    alive = []  # a few results stay alive so that freed blocks are reused in varied orders
    for i in range(products):
        m = rng.choice((1, 2, 3, 7, 8, 64, 100, 1000, 4099))
        n = rng.choice((8, 33, 64, 100, 1000, 4099))
        k = rng.choice((1, 2))
        alive = alive[-49:] + [operand(m, k) @ operand(k, n)]
        if i % 2000 == 0:
            print(f"{i} products", flush=True)
    print(f"clean: {products} products, torch {torch.__version__}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
