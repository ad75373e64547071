"""Kernel-only A/B of the per-ISA port of rope, cross_entropy and optim: the sources at a git
revision (default 105eab1, before the port) built with that revision's flags (-march=native
-ffast-math) against the working tree's built with kernels/_build.py's CFLAGS, in ONE process,
interleaved round by round, on outputs allocated once.

Not a bench_kernels family (no `cases`): run it directly,

    .venv/bin/python benchmarks/kernels/port_ab.py [--rev 105eab1] [--threads 1,2] [--rounds 11]
        [--csv kernels_cross_entropy_optim_cpu.csv]

Both sides are built under benchmarks/.cache/port_ab/ with their ops renamed (fusionlens_before /
fusionlens_after), each with its own copy of the headers, so neither touches the project's
extension. Shapes are the bench_kernels ones: rope q 4x12x512x64 (fwd), cross-entropy 4096x32000
fp32 (ce_forward, ce_backward), AdamW and LAMB steps over the 52-tensor, 35.4M-parameter set of
benchmarks/kernels/optim.py. Rows: benchmark "port_ab <op>", variants before_<rev> / after and the
per-round speedup after over before.
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

OLD_CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math", "-fno-finite-math-only", "-std=c++17"]
SOURCES = ("rope.cpp", "cross_entropy.cpp", "optim.cpp")


def _read(rev: str | None, rel: str) -> str:
    if rev is None:
        return (ROOT / rel).read_text()
    return subprocess.run(["git", "show", f"{rev}:{rel}"], cwd=ROOT, text=True, capture_output=True,
                          check=True).stdout


def build(side: str, rev: str | None, cflags: list[str]) -> object:
    """Build the three sources (and their headers) of `rev` (None: working tree) as fusionlens_<side>."""
    from torch.utils import cpp_extension

    from kernels._build import LDFLAGS

    tag = rev or "worktree"
    out = ROOT / "benchmarks" / ".cache" / "port_ab" / f"{side}_{tag}"
    out.mkdir(parents=True, exist_ok=True)
    names = subprocess.run(["git", "ls-tree", "--name-only", rev or "HEAD", "kernels/csrc/"], cwd=ROOT, text=True,
                           capture_output=True, check=True).stdout.split()
    headers = [Path(n).name for n in names if n.endswith(".h")]
    if rev is None:
        headers = sorted({*headers, *(p.name for p in (ROOT / "kernels" / "csrc").glob("*.h"))})
    for h in headers:
        text = _read(rev, f"kernels/csrc/{h}")
        if not (out / h).exists() or (out / h).read_text() != text:
            (out / h).write_text(text)
    sources = []
    for name in SOURCES:
        text = _read(rev, f"kernels/csrc/{name}")
        text = text.replace("TORCH_LIBRARY_FRAGMENT(fusionlens,", f"TORCH_LIBRARY_FRAGMENT(fusionlens_{side},")
        text = text.replace("TORCH_LIBRARY_IMPL(fusionlens,", f"TORCH_LIBRARY_IMPL(fusionlens_{side},")
        if not (out / name).exists() or (out / name).read_text() != text:
            (out / name).write_text(text)
        sources.append(str(out / name))
    cpp_extension.load(name=f"fl_port_ab_{side}_{tag}", sources=sources, extra_cflags=cflags, extra_ldflags=LDFLAGS,
                       extra_include_paths=[str(out)], build_directory=str(out), is_python_module=False)
    return getattr(torch.ops, f"fusionlens_{side}")


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
        "lamb_step_": lambda: ops.lamb_step_(ps, t["grads"], ms, vs, steps, 1e-4, 0.9, 0.999, 1e-6, 0.01, 1.0,
                                             True, True, True, False),
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
    for threads in [int(v) for v in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for op in calls_a:
            load = os.getloadavg()[0]
            timing = interleave({before: calls_b[op], "after": calls_a[op]}, rounds=args.rounds, inner=3)
            notes = (f"threads={threads}; load={load:.1f}; preallocated outputs; A/B vs {args.rev} "
                     f"({' '.join(OLD_CFLAGS)}) -> worktree ({' '.join(CFLAGS)})")
            rows = timing_rows(f"port_ab {op}", "bench_kernels shape", timing, notes=notes)
            speed = timing.ratio(before, "after")
            rows.append(dict(benchmark=f"port_ab {op}", variant=f"after_vs_{before}", shape="bench_kernels shape",
                             metric="speedup_wall", p20=speed[0], p50=speed[1], p80=speed[2], unit="x", notes=notes))
            append_rows(args.csv, rows)
            pb = percentiles(x * 1e3 for x in timing.wall_s[before])
            pa = percentiles(x * 1e3 for x in timing.wall_s["after"])
            print_table(f"{op} threads={threads} load={load:.1f}",
                        ["variant", "p20 ms", "p50 ms", "p80 ms", "before/after p20/p50/p80"],
                        [[before, *pb, ""], ["after", *pa, "/".join(f"{v:.2f}" for v in speed)]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
