"""Kernel-only A/B of compiler flags: the per-ISA kernels (norms, activations, softmax) built from
ONE snapshot of kernels/csrc with the old flags (-march=native -ffast-math) and with the current
ones (kernels/_build.py CFLAGS), timed in one process, interleaved round by round.

Not a bench_kernels family (no `cases`): run it directly,

    .venv/bin/python benchmarks/kernels/flags_ab.py [--threads 1] [--rounds 11]
        [--shapes 4096x768,4096x4096] [--csv kernels_flags_ab.csv]
        [--old-rev REV [--old-flags current]]   (same flags: a source A/B of REV vs the working tree)

Both builds are made by benchmarks/kernels/ab_build.py under benchmarks/.cache/flags_ab/ with their
ops renamed (fusionlens_old / fusionlens_new), so the project's own extension is not touched; the
sources are read once, so a source edited meanwhile by someone else cannot skew one side. Forward
passes only, fp32 (--dtype for bf16/fp16), preallocated outputs: the question is whether dropping
the global flags slowed the loops that now get their vector ISA from per_isa.h's pragmas. Rows
(benchmark "flags_ab <op>", variants old_flags / new_flags [/ alt_flags] and the speedup new over
old) go to benchmarks/results/<csv>.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # first, even when PYTHONPATH has it: benchmarks/kernels/ must not shadow kernels

import torch  # noqa: E402

from benchmarks.kernels.ab_build import CACHE, OLD_CFLAGS, build_variant, run_ab, snapshot_id, sources_at  # noqa: E402

SOURCES = ("norms.cpp", "activations.cpp", "softmax.cpp")


def buffers(m: int, n: int, dtype: torch.dtype = torch.float32) -> dict:
    """Inputs and outputs in `dtype`; norm weights and statistics stay fp32 (as norms.py passes)."""
    g = torch.Generator().manual_seed(0)
    t = {k: torch.randn(m, n, generator=g).to(dtype) for k in ("x", "b2")}
    t.update(w=1 + 0.1 * torch.randn(n, generator=g), bias=(0.1 * torch.randn(n, generator=g)).to(dtype),
             y=torch.empty(m, n, dtype=dtype), mean=torch.empty(m), rstd=torch.empty(m),
             none=torch.empty(0, dtype=dtype))
    return t


def op_calls(ops, t: dict) -> dict:
    """Zero-argument forward calls of each op on preallocated outputs (kinds: activations.cpp)."""
    x, b2, w, bias, y, mean, rstd, none = (t[k] for k in ("x", "b2", "w", "bias", "y", "mean", "rstd", "none"))
    b32 = bias.float()
    return {
        "layer_norm": lambda: ops.layer_norm_fwd(x, None, w, b32, 1e-5, y, none, mean, rstd),
        "rms_norm": lambda: ops.rms_norm_fwd(x, None, w, 1e-6, True, y, none, rstd),
        "gelu_erf": lambda: ops.act_fwd(x, None, y, 1),
        "bias_gelu_tanh": lambda: ops.act_fwd(x, bias, y, 2),
        "swiglu": lambda: ops.glu_fwd(x, b2, y, 0),
        "softmax": lambda: ops.softmax_fwd(x, None, y, 1.0, False),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--shapes", default="4096x768,4096x4096")
    ap.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16 inputs/outputs")
    ap.add_argument("--csv", default="kernels_flags_ab.csv")
    ap.add_argument("--alt-flags", default="", help="a third build's flags (space separated), timed as alt_flags")
    ap.add_argument("--old-rev", default="", help="build the old-flags side from this git revision's kernels/csrc "
                    "(default: the same working-tree snapshot as the new side)")
    ap.add_argument("--old-flags", default="", help="the old side's flags (space separated; 'current' = "
                    "kernels/_build.py CFLAGS, for a same-flags A/B of --old-rev against the working tree; "
                    "default: the old -march=native -ffast-math set)")
    args = ap.parse_args(argv)
    from kernels._build import CFLAGS

    old_cflags = list(CFLAGS) if args.old_flags == "current" else (args.old_flags.split() or list(OLD_CFLAGS))

    files = sources_at(None, SOURCES)  # read once: both sides see the same working-tree bytes
    old_files = sources_at(args.old_rev, SOURCES) if args.old_rev else files
    snap, old_snap = snapshot_id(files), snapshot_id(old_files)
    cache = CACHE / "flags_ab"
    old = getattr(torch.ops, build_variant("old", old_files, old_cflags, cache))
    new = getattr(torch.ops, build_variant("new", files, CFLAGS, cache))
    alt_flags = args.alt_flags.split()
    alt = getattr(torch.ops, build_variant("alt", files, alt_flags, cache)) if alt_flags else None
    print(f"snapshot {snap} (old side {old_snap}); old flags {' '.join(old_cflags)}; new flags {' '.join(CFLAGS)}; "
          f"ISA copies old/new: norms {old.norms_isa()}/{new.norms_isa()}, "
          f"activations {old.activations_isa()}/{new.activations_isa()}, softmax {old.softmax_isa()}/{new.softmax_isa()}")
    torch.set_num_threads(args.threads)
    src = f"snapshot {snap}" + (f"; old side from {args.old_rev} ({old_snap})" if args.old_rev else "")
    detail = f"{src}; old={' '.join(old_cflags)}; new={' '.join(CFLAGS)}"
    detail += f"; alt={args.alt_flags}" if alt is not None else ""
    dtype = getattr(torch, args.dtype)
    for m, n in [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]:
        calls_o, calls_n = op_calls(old, buffers(m, n, dtype)), op_calls(new, buffers(m, n, dtype))
        calls_a = op_calls(alt, buffers(m, n, dtype)) if alt is not None else {}
        shape = f"{m}x{n} {args.dtype} fwd"
        for op in calls_n:
            variants = {"old_flags": calls_o[op], "new_flags": calls_n[op]}
            if calls_a:
                variants["alt_flags"] = calls_a[op]
            run_ab(variants, baseline="old_flags", candidate="new_flags", speedup_variant="new_vs_old_flags",
                   benchmark=f"flags_ab {op}", shape=shape, title=f"{op} {shape}", threads=args.threads, detail=detail,
                   csv=args.csv, rounds=args.rounds, inner=max(2, int(6e6 / (m * n))),
                   ratio_header="old/this p20/p50/p80")
    return 0


if __name__ == "__main__":
    sys.exit(main())
