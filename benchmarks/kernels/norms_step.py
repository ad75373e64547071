"""Where one LayerNorm training step's time goes: ours (provider="cpu") against F.layer_norm.

Not a bench_kernels family: run it directly,

    .venv/bin/python benchmarks/kernels/norms_step.py [--shapes 4096x768] [--dtypes float32,bfloat16]
        [--threads 1] [--rounds 15] [--csv kernels.csv]

The step is forward + `torch.autograd.grad` of x, weight and bias against a fixed upstream grad
(what bench_kernels times). Its pieces are timed interleaved, round by round, in one process:
- step_ours / step_aten: the whole step through the public API / F.layer_norm;
- fwd_kernel / bwd_kernel: our C++ ops on outputs allocated once (the kernels' own time);
- fwd_fresh / bwd_fresh: the same ops on outputs allocated per call through `registry.new_output`
  (kernels + allocation + first touch of fresh pages);
- aten_fwd_kernel / aten_bwd_kernel: `aten::native_layer_norm(_backward)` called directly;
- step_cppfn / step_pyfn: our step without the registry dispatch, through the C++ autograd node
  (`fusionlens::norm_train`, what the cpu provider trains with) / the Python autograd.Function it
  replaced (`apply_norm(..., cpp_autograd=False)`): before/after of the autograd road in one run;
- infer_ours / infer_pyfn / infer_aten: the forward alone on inputs without grad (public API /
  the Python road's forward / F.layer_norm);
- py_step_tiny: our whole step at 1 row (the Python, dispatch and autograd cost per step, the
  kernels being ~free there); aten_step_tiny likewise.
CPU time (1 thread: immune to other processes) and wall time, p20/p50/p80; rows (benchmark
"layer_norm_step") go to benchmarks/results/<csv>.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # first, even when PYTHONPATH has it: benchmarks/kernels/ must not shadow kernels

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kernels  # noqa: E402
from benchmarks.harness import append_rows, interleave, percentiles, print_table, timing_rows  # noqa: E402
from kernels.registry import new_output  # noqa: E402


def _inputs(m: int, n: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    t = {k: torch.randn(m, n, generator=g).to(dtype) for k in ("x", "dy")}
    t["w"] = (1 + 0.1 * torch.randn(n, generator=g)).to(dtype)
    t["b"] = (0.1 * torch.randn(n, generator=g)).to(dtype)
    return t


def _step(fn, t: dict[str, torch.Tensor]):
    """forward + autograd.grad(x, w, b) against t["dy"]."""
    args = [t[k].detach().clone().requires_grad_(True) for k in ("x", "w", "b")]
    dy = t["dy"]

    def run():
        return torch.autograd.grad(fn(*args), args, dy)
    return run


def variants(m: int, n: int, dtype: torch.dtype) -> dict[str, object]:
    """Zero-argument callables of every piece (see the module docstring)."""
    from kernels.norm_function import apply_norm
    from kernels.providers import cpu_ops

    ops = cpu_ops()
    t, tiny = _inputs(m, n, dtype), _inputs(1, n, dtype)
    ours = lambda x, w, b: kernels.layer_norm(x, w, b, 1e-5, provider="cpu")  # noqa: E731
    aten = lambda x, w, b: F.layer_norm(x, (n,), w, b, 1e-5)  # noqa: E731
    cppfn = lambda x, w, b: apply_norm("cpu", "ln", x, None, w, b, 1e-5, 0.0, False)  # noqa: E731
    pyfn = lambda x, w, b: apply_norm("cpu", "ln", x, None, w, b, 1e-5, 0.0, False, cpp_autograd=False)  # noqa: E731
    x, dy = t["x"], t["dy"]
    w32, b32 = t["w"].float(), t["b"].float()
    y, dx = torch.empty_like(x), torch.empty_like(x)
    mean, rstd, dw, db = (torch.empty(k) for k in (m, m, n, n))
    none = x.new_empty(0)
    ops.layer_norm_fwd(x, None, w32, b32, 1e-5, y, none, mean, rstd)

    def fwd_fresh():
        y2, mu2, r2 = new_output((m, n), x), new_output((m,), x, torch.float32), new_output((m,), x, torch.float32)
        ops.layer_norm_fwd(x, None, w32, b32, 1e-5, y2, none, mu2, r2)

    def bwd_fresh():
        dx2, dw2, db2 = new_output((m, n), x), new_output((n,), x, torch.float32), new_output((n,), x, torch.float32)
        ops.layer_norm_bwd(dy, x, w32, mean, rstd, None, dx2, dw2, db2)

    wa, ba = t["w"], t["b"]
    _, amean, arstd = torch.ops.aten.native_layer_norm(x, (n,), wa, ba, 1e-5)
    return {
        "step_ours": _step(ours, t),
        "step_aten": _step(aten, t),
        "infer_ours": lambda: ours(x, t["w"], t["b"]),
        "infer_pyfn": lambda: pyfn(x, t["w"], t["b"]),
        "infer_aten": lambda: aten(x, t["w"], t["b"]),
        "step_cppfn": _step(cppfn, t),
        "step_pyfn": _step(pyfn, t),
        "fwd_kernel": lambda: ops.layer_norm_fwd(x, None, w32, b32, 1e-5, y, none, mean, rstd),
        "bwd_kernel": lambda: ops.layer_norm_bwd(dy, x, w32, mean, rstd, None, dx, dw, db),
        "fwd_fresh": fwd_fresh,
        "bwd_fresh": bwd_fresh,
        "aten_fwd_kernel": lambda: torch.ops.aten.native_layer_norm(x, (n,), wa, ba, 1e-5),
        "aten_bwd_kernel": lambda: torch.ops.aten.native_layer_norm_backward(
            dy, x, (n,), amean, arstd, wa, ba, [True, True, True]),
        "py_step_tiny": _step(ours, tiny),
        "aten_step_tiny": _step(aten, tiny),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--shapes", default="4096x768")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--only", default="", help="comma-separated subset of the variants")
    ap.add_argument("--csv", default="kernels.csv")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    for dtype in [getattr(torch, d) for d in args.dtypes.split(",")]:
        for m, n in [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]:
            vs = variants(m, n, dtype)
            if args.only:
                vs = {k: v for k, v in vs.items() if k in args.only.split(",")}
            load = os.getloadavg()[0]
            inner = max(1, int(3e6 / (m * n)))
            timing = interleave(vs, rounds=args.rounds, inner=inner, warmup=2)
            tiny = {k: interleave({k: v}, rounds=args.rounds, inner=200).cpu_s[k] for k, v in vs.items()
                    if k.endswith("_tiny")}
            timing.cpu_s.update(tiny)
            timing.wall_s.update(tiny)
            shape = f"{m}x{n} {str(dtype).replace('torch.', '')}"
            notes = f"threads={args.threads}; load={load:.1f}; fwd+autograd.grad(x,w,b); rev={_rev()}"
            append_rows(args.csv, timing_rows("layer_norm_step", shape, timing, unit_scale=1e6, unit="us",
                                              notes=notes))
            rows = [[k, *(f"{v:.0f}" for v in percentiles(s * 1e6 for s in timing.cpu_s[k])),
                     *(f"{v:.0f}" for v in percentiles(s * 1e6 for s in timing.wall_s[k]))] for k in vs]
            print_table(f"layer_norm step {shape} threads={args.threads} load={load:.1f}",
                        ["piece", "cpu p20 us", "p50", "p80", "wall p20 us", "p50", "p80"], rows)
            if "step_ours" in vs and "step_aten" in vs:
                r = timing.ratio("step_aten", "step_ours", "cpu_s")
                print(f"aten/ours step (cpu time, per round): p20 {r[0]:.2f} p50 {r[1]:.2f} p80 {r[2]:.2f}")
            if "step_cppfn" in vs and "step_pyfn" in vs:
                r = timing.ratio("step_pyfn", "step_cppfn", "cpu_s")
                print(f"python Function / C++ node step (cpu time, per round): p20 {r[0]:.2f} p50 {r[1]:.2f} "
                      f"p80 {r[2]:.2f}")
    return 0


def _rev() -> str:
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True, capture_output=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "kernels/csrc", "kernels/norm*"], cwd=ROOT,
                               text=True, capture_output=True, timeout=10).stdout.strip()
        return (out or "unknown") + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
