"""Per-family kernel benchmark modules, driven by `benchmarks/bench_kernels.py`.

Contract: each module `benchmarks/kernels/<family>.py` exposes

    def cases(threads: int) -> list[dict]

The driver has already called `torch.set_num_threads(threads)` and pointed the inductor cache at
a fresh directory (so the first torch.compile in the process is a cold compile). `cases` builds
its inputs (keep them under ~1 GB in all) and returns one dict per (kernel, pass, shape, dtype):

    {
      "kernel":   "rms_norm",          # registry name (benchmark column)
      "pass":     "fwd" | "fwd+bwd",   # what one call of a variant does
      "shape":    "4096x768",          # free text, stable across runs
      "dtype":    "float32",
      "variants": {                    # zero-argument callables; ONE call = one step
          "naive": ..., "aten": ..., "ours": ...,   # "ours" is required; names are free text
      },
      "compile":  make_step or None,   # zero-arg callable that returns a fresh torch.compile'd
                                       # step (e.g. `lambda: step_of(torch.compile(reference))`);
                                       # the driver times its first call cold and warm (after
                                       # torch._dynamo.reset()), then adds it to variants as
                                       # "compile"
      "baseline": "naive",             # optional: variant used for torch.compile break-even
      "bytes":    float,               # optional: algorithmic bytes one step moves in the fused
                                       # kernel (Cost.bytes_fused, x3 for fwd+bwd as applicable);
                                       # the driver prints GB/s and % of measured copy bandwidth
      "inner":    int,                 # optional: calls per timed sample (default: auto, >= 20 ms)
      "notes":    str,                 # optional: goes into the CSV notes column
    }

The driver interleaves all variants of a case round by round (`benchmarks.harness.interleave`),
prints ratios of every variant over "ours" measured in the same rounds, and appends p20/p50/p80
rows (wall and CPU time, ratios, compile times, GB/s) to `benchmarks/results/kernels.csv`.
Register a new family by adding its module name to `FAMILIES` in `benchmarks/bench_kernels.py`
(or pass `--family NAME`; any module in this package with a `cases` function works).

Optional, for the GPU check (`benchmarks/gpu/kernels_check.py`, run by `benchmarks/gpu_check.sh`
on a lent NVIDIA GPU; it tries the families listed in its FAMILIES):

    def gpu_cases(device: str = "cuda") -> list[dict]
        Same dict contract, tensors on `device`, "ours" = the triton provider, large shapes
        (memory-bound kernels should reach >= 90% of the D2D copy bandwidth), "bytes" required;
        add variants "liger" / "apex" when those packages import. No "inner" needed.
    def gpu_checks(device: str = "cuda") -> list[tuple[str, Callable[[], None]]]
        Correctness at real sizes: (name, zero-arg check raising AssertionError on a mismatch),
        e.g. `tests.kernels.numerics.check_against_reference` calls.

Keep the GPU part of a family under ~15 s (compile included): the whole check has 90 s.
See `benchmarks/kernels/norms.py` for a complete example of all three functions.
"""

from __future__ import annotations

import os


def shape_wanted(m: int, n: int) -> bool:
    """True unless FL_BENCH_SHAPES (e.g. "4096x768,4096x3072") names shapes and m x n is not one."""
    wanted = os.environ.get("FL_BENCH_SHAPES")
    return not wanted or f"{m}x{n}" in wanted.split(",")
