"""Our kernel modules eager and under torch.compile, next to PyTorch's own modules both ways.

Usage (from the repo root):
    .venv/bin/python benchmarks/bench_compiled_modules.py [--threads 1] [--rounds 7] [--inner 5]
        [--cases swiglu,layer_norm,rms_norm]

A training step (forward + backward against a fixed grad) of one module per case, at a realistic
size, four variants interleaved round by round (`benchmarks.harness`): `ours` (the `kernels`
module, measured provider choice), `ours_compiled` (the same module under torch.compile, default
Inductor backend), `torch` (PyTorch's module or eager composition) and `torch_compiled`. Compile
time is paid in the warm-up and reported apart. What it watches: a compiled graph takes our ops'
large outputs from the output pool too (`fusionlens::empty_output`), so compiling a model on our
kernels costs nothing against eager; before 2026-12-02 Inductor's own allocations paid a page
fault per 4 KiB on every call (SwiGLU 4096 x 3072: 109 ms compiled against 23 eager).
Rows go to `benchmarks/results/compiled_modules.csv`.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # first, even when PYTHONPATH has it: benchmarks/kernels/ must not shadow kernels

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kernels  # noqa: E402
from benchmarks.harness import append_rows, interleave, machine, percentiles, print_table, timing_rows  # noqa: E402


class TorchSwiGLU(torch.nn.Module):
    """The eager composition our SwiGLU module replaces: silu(gate) * up on a packed projection."""

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        a, b = h.chunk(2, -1)
        return F.silu(a) * b


# case -> (ours, torch's, input shape, output shape)
CASES = {
    "swiglu": (lambda: kernels.SwiGLU(), TorchSwiGLU, (4096, 6144), (4096, 3072)),
    "layer_norm": (lambda: kernels.LayerNorm(768), lambda: torch.nn.LayerNorm(768), (4096, 768), (4096, 768)),
    "rms_norm": (lambda: kernels.RMSNorm(4096, eps=1e-6), lambda: torch.nn.RMSNorm(4096, eps=1e-6),
                 (4096, 4096), (4096, 4096)),
}


def step_fn(module: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor):
    def step() -> None:
        x.grad = None
        module(x).backward(grad)
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--inner", type=int, default=5)
    ap.add_argument("--cases", default=",".join(CASES))
    opts = ap.parse_args()
    torch.set_num_threads(opts.threads)
    rows, table = [], []
    for name in opts.cases.split(","):
        make_ours, make_torch, in_shape, out_shape = CASES[name]
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(in_shape, generator=gen, requires_grad=True)
        grad = torch.randn(out_shape, generator=gen)
        modules = {"ours": make_ours(), "torch": make_torch()}
        modules["ours_compiled"] = torch.compile(modules["ours"])
        modules["torch_compiled"] = torch.compile(modules["torch"])
        steps = {k: step_fn(m, x, grad) for k, m in modules.items()}
        compile_s = {}
        for k in ("ours_compiled", "torch_compiled"):
            t0 = time.perf_counter()
            steps[k]()  # the compile, outside the timing
            compile_s[k] = time.perf_counter() - t0
        timing = interleave(steps, rounds=opts.rounds, inner=opts.inner, warmup=2)
        shape = "x".join(map(str, in_shape))
        notes = f"threads={opts.threads}; fwd+bwd; compile_s ours={compile_s['ours_compiled']:.1f} " \
                f"torch={compile_s['torch_compiled']:.1f}"
        rows += timing_rows("compiled_modules", f"{name}:{shape}", timing, notes=notes)
        ms = {k: [q * 1e3 for q in percentiles(v)] for k, v in timing.cpu_s.items()}  # p20, p50, p80
        med = {k: q[1] for k, q in ms.items()}
        cell = {k: f"{p50:.2f} ({p20:.2f}-{p80:.2f})" for k, (p20, p50, p80) in ms.items()}
        table.append([name, shape, cell["ours"], cell["ours_compiled"], cell["torch"], cell["torch_compiled"],
                      f"{med['ours_compiled'] / med['ours']:.2f}",
                      f"{med['torch_compiled'] / med['ours_compiled']:.2f}"])
    print(f"machine: {machine()}")
    print_table("fwd+bwd CPU ms per step, median (p20-p80)",
                ["case", "input", "ours", "ours compiled", "torch", "torch compiled",
                 "compiled/eager ours", "torch compiled / ours compiled"], table)
    print(f"\nrows appended to {append_rows('compiled_modules.csv', rows)}")


if __name__ == "__main__":
    main()
