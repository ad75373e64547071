"""Kernel-only A/B of the norm C++ ops: an earlier norms.cpp (git revision, default e66a811) against
the working tree's, in ONE process, interleaved round by round, on outputs allocated once.

Not a bench_kernels family (no `cases`): run it directly,

    .venv/bin/python benchmarks/kernels/norms_ab.py [--rev e66a811] [--threads 1] [--rounds 11]
        [--shapes 4096x768,4096x4096] [--dtypes float32,bfloat16] [--csv kernels.csv]

The old source is extracted with `git show REV:kernels/csrc/norms.cpp` (and the csrc headers at
REV, so the old .cpp never compiles against the working tree's headers), its ops renamed to
`fusionlens_before::*`, and built alone (same flags as kernels/_build.py) under
benchmarks/.cache/; the new ops are the project's extension. Both see the same inputs, so the
per-round ratio before/after cancels most of the machine's load swings. Rows (benchmark
"norms_ab", variants before_<rev> / after, wall and CPU time, speedup) go to benchmarks/results/.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.harness import append_rows, interleave, percentiles, print_table, timing_rows  # noqa: E402


def load_old(rev: str) -> object:
    """Build norms.cpp at `rev` with its ops renamed to fusionlens_before; return that op namespace."""
    from torch.utils import cpp_extension

    from kernels._build import CFLAGS, LDFLAGS

    def show(path: str) -> str:
        return subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, text=True, capture_output=True,
                              check=True).stdout

    src = show("kernels/csrc/norms.cpp")
    src = src.replace("TORCH_LIBRARY_FRAGMENT(fusionlens,", "TORCH_LIBRARY_FRAGMENT(fusionlens_before,")
    src = src.replace("TORCH_LIBRARY_IMPL(fusionlens,", "TORCH_LIBRARY_IMPL(fusionlens_before,")
    build = ROOT / "benchmarks" / ".cache" / f"norms_ab_{rev}"
    (build / "include").mkdir(parents=True, exist_ok=True)
    # The headers norms.cpp includes (norms_impl.h, per_isa.h, common.h) at the same revision, so
    # "before" is the old code throughout, not the old .cpp over the working tree's headers.
    listed = subprocess.run(["git", "ls-tree", "--name-only", rev, "kernels/csrc/"], cwd=ROOT, text=True,
                            capture_output=True, check=True).stdout.split()
    for header in (h for h in listed if h.endswith(".h")):
        dst = build / "include" / Path(header).name
        text = show(header)
        if not dst.exists() or dst.read_text() != text:
            dst.write_text(text)
    path = build / "norms_before.cpp"
    if not path.exists() or path.read_text() != src:
        path.write_text(src)
    cpp_extension.load(name=f"fl_norms_before_{rev}", sources=[str(path)], extra_cflags=CFLAGS,
                       extra_ldflags=LDFLAGS, extra_include_paths=[str(build / "include")],
                       build_directory=str(build), is_python_module=False)
    return torch.ops.fusionlens_before


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
                load = os.getloadavg()[0]
                timing = interleave({before: calls_b[op], "after": calls_a[op]}, rounds=args.rounds, inner=inner)
                shape = f"{m}x{n} {str(dtype).replace('torch.', '')} {op.split()[1]}"
                notes = f"threads={args.threads}; load={load:.1f}; preallocated outputs; A/B vs {args.rev}"
                rows = timing_rows(op.split()[0], shape, timing, notes=notes)
                speed = timing.ratio(before, "after")
                rows.append(dict(benchmark=op.split()[0], variant=f"after_vs_{before}", shape=shape,
                                 metric="speedup_wall", p20=speed[0], p50=speed[1], p80=speed[2], unit="x",
                                 notes=notes))
                append_rows(args.csv, rows)
                pb = percentiles(x * 1e3 for x in timing.wall_s[before])
                pa = percentiles(x * 1e3 for x in timing.wall_s["after"])
                print_table(f"{op.split()[0]} {shape} threads={args.threads} load={load:.1f}",
                            ["variant", "p20 ms", "p50 ms", "p80 ms", "before/after p20/p50/p80"],
                            [[before, *pb, ""], ["after", *pa, "/".join(f"{v:.2f}" for v in speed)]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
