"""Kernel-only A/B of the norm C++ ops: an earlier norms.cpp (git revision, default e66a811) against
the working tree's, in ONE process, interleaved round by round, on outputs allocated once.

Not a bench_kernels family (no `cases`): run it directly,

    .venv/bin/python benchmarks/kernels/norms_ab.py [--rev e66a811] [--threads 1] [--rounds 11]
        [--shapes 4096x768,4096x4096] [--dtypes float32,bfloat16] [--csv kernels.csv]

The old source is extracted with `git show REV:kernels/csrc/norms.cpp` (and the csrc headers at
REV, so the old .cpp never compiles against the working tree's headers), its ops renamed to
`fusionlens_before::*`, and built alone (same flags as kernels/_build.py) under
benchmarks/.cache/norms_ab/ by benchmarks/kernels/ab_build.py; the new ops are the project's
extension. Both see the same inputs, so the per-round ratio before/after cancels most of the
machine's load swings. Rows (benchmark = the op, e.g. "layer_norm"; variants before_<rev> / after,
wall and CPU time, and after_vs_before_<rev> speedup) go to benchmarks/results/<csv>.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # first, even when PYTHONPATH has it: benchmarks/kernels/ must not shadow kernels

import torch  # noqa: E402

from benchmarks.kernels.ab_build import load_side, run_ab  # noqa: E402


def load_old(rev: str) -> object:
    """Build norms.cpp (and the headers) at `rev` with its ops renamed to fusionlens_before; return them."""
    from kernels._build import CFLAGS

    return load_side("before", rev, ["norms.cpp"], CFLAGS, "norms_ab")


def op_calls(ops, t: dict) -> dict:
    """Zero-argument calls of each op on preallocated outputs `t` (fp32 weight/bias, as norms.py passes)."""
    x, r, dy, w, b = t["x"], t["r"], t["dy"], t["w"], t["b"]
    y, s, dx, mean, rstd, dw, db, none = t["y"], t["s"], t["dx"], t["mean"], t["rstd"], t["dw"], t["db"], t["none"]
    return {
        "layer_norm fwd": lambda: ops.layer_norm_fwd(x, None, w, b, 1e-5, y, none, mean, rstd),
        "layer_norm bwd": lambda: ops.layer_norm_bwd(dy, x, w, mean, rstd, None, dx, dw, db),
        "rms_norm fwd": lambda: ops.rms_norm_fwd(x, None, w, 1e-6, True, y, none, rstd),
        "rms_norm bwd": lambda: ops.rms_norm_bwd(dy, x, w, rstd, None, True, dx, dw),
        "add_rms_norm fwd": lambda: ops.rms_norm_fwd(x, r, w, 1e-6, True, y, s, rstd),
        "add_rms_norm bwd": lambda: ops.rms_norm_bwd(dy, s, w, rstd, dy, True, dx, dw),
    }


def buffers(m: int, n: int, dtype: torch.dtype) -> dict:
    g = torch.Generator().manual_seed(0)
    t = {k: torch.randn(m, n, generator=g).to(dtype) for k in ("x", "r", "dy")}
    t["w"] = 1 + 0.1 * torch.randn(n, generator=g)
    t["b"] = 0.1 * torch.randn(n, generator=g)
    t.update(y=torch.empty(m, n, dtype=dtype), s=torch.empty(m, n, dtype=dtype), dx=torch.empty(m, n, dtype=dtype),
             mean=torch.empty(m), rstd=torch.empty(m), dw=torch.empty(n), db=torch.empty(n), none=torch.empty(0, dtype=dtype))
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="e66a811")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--shapes", default="4096x768,4096x4096")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--csv", default="kernels.csv")
    args = ap.parse_args(argv)
    from kernels._build import load_cpu_ops

    load_cpu_ops()
    old, new = load_old(args.rev), torch.ops.fusionlens
    torch.set_num_threads(args.threads)
    before = f"before_{args.rev}"
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        for m, n in [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]:
            tb, ta = buffers(m, n, dtype), buffers(m, n, dtype)
            calls_b, calls_a = op_calls(old, tb), op_calls(new, ta)
            inner = max(2, int(6e6 / (m * n)))
            for op in calls_a:
                kernel, direction = op.split()
                shape = f"{m}x{n} {str(dtype).replace('torch.', '')} {direction}"
                run_ab({before: calls_b[op], "after": calls_a[op]}, baseline=before, candidate="after",
                       speedup_variant=f"after_vs_{before}", benchmark=kernel, shape=shape, title=f"{kernel} {shape}",
                       threads=args.threads, detail=f"A/B vs {args.rev}", csv=args.csv, rounds=args.rounds,
                       inner=inner)
    return 0


if __name__ == "__main__":
    sys.exit(main())
