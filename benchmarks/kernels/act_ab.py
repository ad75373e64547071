"""Kernel-only A/B of the activation spans (kernels/csrc/activations*.{cpp,h}): the sources at a git
revision against the working tree's, both built with kernels/_build.py's CFLAGS, in ONE process.

First a bit-for-bit check: every op (act_fwd with and without a bias, act_bwd with and without a
bias gradient, glu_fwd, glu_bwd), every kind (SiLU, GELU erf, GELU tanh) and dtype (fp32, bf16,
fp16), on odd shapes and on values that stress the exp and the rounding (+-inf, NaN, huge, tiny,
denormal, +-0). A change meant to keep the arithmetic (a reordered loop) must print 0 differing
cases (NaN payloads aside: see same_bits). Then the timing: each op at 4096x3072, interleaved round by round, on outputs allocated once.

    .venv/bin/python benchmarks/kernels/act_ab.py [--rev HEAD] [--dtypes bfloat16,float32]
        [--threads 1] [--rounds 11] [--check-only] [--allow-differ]

Both sides are built by benchmarks/kernels/ab_build.py under benchmarks/.cache/act_ab/ with their
ops renamed (fusionlens_before / fusionlens_after), so neither touches the project's extension.
Rows: benchmark "act_ab <op> <kind> <dtype>", variants before_<rev> / after and the per-round
speedup after over before, in benchmarks/results/kernels_activations_softmax_cpu.csv.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # first, even when PYTHONPATH has it: benchmarks/kernels/ must not shadow kernels

import torch  # noqa: E402

from benchmarks.kernels.ab_build import load_side, run_ab  # noqa: E402

SOURCES = ("activations.cpp",)
KINDS = {"silu": 0, "gelu": 1, "gelu_tanh": 2}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CHECK_SHAPES = ((1, 1), (3, 5), (2, 1031), (17, 4099), (64, 3072))
_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def build(side: str, rev: str | None) -> object:
    from kernels._build import CFLAGS

    return load_side(side, rev, SOURCES, CFLAGS, "act_ab")


def stress(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Normal values at several scales with specials planted at random places."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.tensor([0.5, 3.0, 12.0, 90.0])[torch.randint(0, 4, shape, generator=g)]
    specials = torch.tensor([float("inf"), -float("inf"), float("nan"), 0.0, -0.0, 1e-40, -1e-40, 88.0, -88.0,
                             1e30, -1e30, 5.65685, -5.65685])
    pick = torch.rand(shape, generator=g) < 0.05
    x[pick] = specials[torch.randint(0, len(specials), (int(pick.sum()),), generator=g)]
    return x.to(dtype)


def op_calls(ops, kind: int, t: dict) -> dict:
    """Zero-argument calls of every op of one kind, each writing this side's own outputs; returns
    {name: (call, outputs)}."""
    x, bias, g, b = t["x"], t["bias"], t["g"], t["b"]
    out = {k: torch.empty_like(x) for k in ("y", "yb", "gx", "gxb", "glu", "ga", "gb")}
    gbias = torch.empty_like(bias)
    return {
        "act_fwd": (lambda: ops.act_fwd(x, None, out["y"], kind), [out["y"]]),
        "act_fwd bias": (lambda: ops.act_fwd(x, bias, out["yb"], kind), [out["yb"]]),
        "act_bwd": (lambda: ops.act_bwd(g, x, None, out["gx"], None, kind), [out["gx"]]),
        "act_bwd bias": (lambda: ops.act_bwd(g, x, bias, out["gxb"], gbias, kind), [out["gxb"], gbias]),
        "glu_fwd": (lambda: ops.glu_fwd(x, b, out["glu"], kind), [out["glu"]]),
        "glu_bwd": (lambda: ops.glu_bwd(g, x, b, out["ga"], out["gb"], kind), [out["ga"], out["gb"]]),
    }


def tensors(shape: tuple[int, int], dtype: torch.dtype, seed: int) -> dict:
    return dict(x=stress(shape, dtype, seed), b=stress(shape, dtype, seed + 1), g=stress(shape, dtype, seed + 2),
                bias=stress((shape[-1],), dtype, seed + 3))


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, but for NaN payloads: which NaN a product of two NaNs keeps depends on the
    operands' order in the instruction, which the compiler may pick either way."""
    differ = a.view(_BITS[a.dtype]) != b.view(_BITS[b.dtype])
    return not bool((differ & ~(a.isnan() & b.isnan())).any())


def check(old, new, threads: int) -> int:
    """Runs every op on both sides; prints and returns the number of cases whose outputs differ."""
    torch.set_num_threads(threads)
    bad = cases = 0
    for (kname, kind), (dname, dtype), shape in itertools.product(KINDS.items(), DTYPES.items(), CHECK_SHAPES):
        t = tensors(shape, dtype, seed=sum(shape) + kind)
        a, b = op_calls(old, kind, t), op_calls(new, kind, t)
        for name in a:
            a[name][0]()
            b[name][0]()
            cases += 1
            if not all(same_bits(u, v) for u, v in zip(a[name][1], b[name][1])):
                bad += 1
                print(f"DIFFERS: {name} {kname} {dname} {shape}")
    print(f"bit check ({threads} thread(s)): {cases} cases, {bad} differ")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--kinds", default="silu,gelu,gelu_tanh")
    ap.add_argument("--ops", default="act_fwd,act_bwd bias,glu_fwd,glu_bwd")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--allow-differ", action="store_true",
                    help="time both sides even when outputs differ (a change meant to alter the arithmetic, "
                         "whose accuracy is checked elsewhere)")
    ap.add_argument("--csv", default="kernels_activations_softmax_cpu.csv")
    args = ap.parse_args(argv)
    before = f"before_{args.rev}"
    old, new = build("before", args.rev), build("after", None)
    print(f"ISA copies: before {old.activations_isa()}, after {new.activations_isa()}")
    if check(old, new, 1) + check(old, new, 2) and not args.allow_differ:
        return 1
    if args.check_only:
        return 0
    detail = f"A/B vs {args.rev} -> worktree, same CFLAGS"
    for threads in [int(v) for v in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for dname in args.dtypes.split(","):
            t = tensors((4096, 3072), DTYPES[dname], seed=0)
            for kname in args.kinds.split(","):
                a, b = op_calls(old, KINDS[kname], t), op_calls(new, KINDS[kname], t)
                for op in args.ops.split(","):
                    run_ab({before: a[op][0], "after": b[op][0]}, baseline=before, candidate="after",
                           speedup_variant=f"after_vs_{before}", benchmark=f"act_ab {op} {kname} {dname}",
                           shape="4096x3072", title=f"{op} {kname} {dname} 4096x3072", threads=threads,
                           detail=detail, csv=args.csv, rounds=args.rounds, inner=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
