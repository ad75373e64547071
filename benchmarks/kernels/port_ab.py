"""Kernel-only A/B of the per-ISA port of rope, cross_entropy and optim: the sources at a git
revision (default 105eab1, before the port) built with that revision's flags (-march=native
-ffast-math) against the working tree's built with kernels/_build.py's CFLAGS, in ONE process,
interleaved round by round, on outputs allocated once.

Not a bench_kernels family (no `cases`): run it directly,

    .venv/bin/python benchmarks/kernels/port_ab.py [--rev 105eab1] [--threads 1,2] [--rounds 11]
        [--csv kernels_cross_entropy_optim_cpu.csv]

Both sides are built by benchmarks/kernels/ab_build.py under benchmarks/.cache/port_ab/ with their
ops renamed (fusionlens_before / fusionlens_after), each with its own copy of the headers (from the
same revision as its sources), so neither touches the project's extension. Shapes are the
bench_kernels ones: rope q 4x12x512x64 (fwd), cross-entropy 4096x32000 fp32 (ce_forward,
ce_backward), AdamW and LAMB steps over the 52-tensor, 35.4M-parameter set of
benchmarks/kernels/optim.py. Rows: benchmark "port_ab <op>", variants before_<rev> / after and the
per-round speedup after over before.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # first, even when PYTHONPATH has it: benchmarks/kernels/ must not shadow kernels

import torch  # noqa: E402

from benchmarks.kernels.ab_build import OLD_CFLAGS, load_side, run_ab  # noqa: E402

SOURCES = ("rope.cpp", "cross_entropy.cpp", "optim.cpp")


def build(side: str, rev: str | None, cflags: Sequence[str]) -> object:
    """Build the three sources (and their headers) of `rev` (None: working tree) as fusionlens_<side>."""
    return load_side(side, rev, SOURCES, cflags, "port_ab")


def inputs() -> dict:
    """Shared read-only inputs (logits, targets, rope x/cos/sin, grads) built once."""
    from benchmarks.kernels.optim import param_shapes

    g = torch.Generator().manual_seed(0)
    shapes = param_shapes(4)
    return dict(
        logits=2.0 * torch.randn(4096, 32000, generator=g), target=torch.randint(0, 32000, (4096,), generator=g),
        q=torch.randn(4, 512, 12, 64, generator=g).transpose(1, 2),  # HF's transposed view
        cos=torch.randn(1, 512, 64, generator=g), sin=torch.randn(1, 512, 64, generator=g),
        shapes=shapes, grads=[1e-3 * torch.randn(s, generator=g) for s in shapes])


def _lamb_divisor(ops, value: float):
    """lamb_step_'s clipping divisor as the build at hand takes it: a float before 2026-12-01, a
    one-element tensor since (the one a compiled step passes without a host read)."""
    wants_tensor = str(ops.lamb_step_.default._schema.arguments[10].type) == "Tensor"
    return torch.full((), value, dtype=torch.float64) if wants_tensor else value


def op_calls(ops, t: dict) -> dict:
    """Zero-argument calls on this side's own preallocated outputs and optimizer state."""
    x, tgt = t["logits"], t["target"]
    loss, lse, grad = torch.empty(4096), torch.empty(4096), torch.zeros_like(x)
    grad_rows = torch.full((4096,), 1.0 / 4096)
    rope_out = torch.empty(t["q"].shape)
    g = torch.Generator().manual_seed(1)
    ps = [0.02 * torch.randn(s, generator=g) for s in t["shapes"]]
    ms, vs = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
    steps = [torch.zeros(()) for _ in ps]
    ops.ce_forward(x, tgt, -100, 0.0, loss, lse)
    return {
        "rope fwd": lambda: ops.rope_apply(t["q"], t["cos"], t["sin"], rope_out, False),
        "ce_forward": lambda: ops.ce_forward(x, tgt, -100, 0.0, loss, lse),
        "ce_backward": lambda: ops.ce_backward(x, tgt, lse, grad_rows, -100, 0.0, grad),
        "adamw_step_": lambda: ops.adamw_step_(ps, t["grads"], ms, vs, [], steps, 1e-4, 0.9, 0.999, 1e-8, 0.01,
                                               False, False),
        "lamb_step_": lambda: ops.lamb_step_(ps, t["grads"], ms, vs, steps, 1e-4, 0.9, 0.999, 1e-6, 0.01,
                                             _lamb_divisor(ops, 1.0), True, True, True, False),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="105eab1")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--csv", default="kernels_cross_entropy_optim_cpu.csv")
    args = ap.parse_args(argv)
    from kernels._build import CFLAGS

    before = f"before_{args.rev}"
    old, new = build("before", args.rev, OLD_CFLAGS), build("after", None, CFLAGS)
    t = inputs()
    calls_b, calls_a = op_calls(old, t), op_calls(new, t)
    print(f"after: ISA copies rope {new.rope_isa()}, cross_entropy {new.cross_entropy_isa()}, optim {new.optim_isa()}")
    detail = f"A/B vs {args.rev} ({' '.join(OLD_CFLAGS)}) -> worktree ({' '.join(CFLAGS)})"
    for threads in [int(v) for v in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for op in calls_a:
            run_ab({before: calls_b[op], "after": calls_a[op]}, baseline=before, candidate="after",
                   speedup_variant=f"after_vs_{before}", benchmark=f"port_ab {op}", shape="bench_kernels shape",
                   title=op, threads=threads, detail=detail, csv=args.csv, rounds=args.rounds, inner=3)
    return 0


if __name__ == "__main__":
    sys.exit(main())
