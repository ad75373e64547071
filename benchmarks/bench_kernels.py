"""Kernel benchmark driver: every family's cases, with 1 thread and with all threads, interleaved.

Usage (from the repo root):
    .venv/bin/python benchmarks/bench_kernels.py [--family norms ...] [--threads 1,2]
        [--rounds 7] [--quick] [--no-compile] [--csv kernels.csv]

Per case (see the contract in `benchmarks/kernels/__init__.py`): the variants run interleaved,
round by round, in an order shuffled every round, each variant's turn opened by one untimed call
so its timed calls see its own steady state rather than the memory the variant before it freed
(`benchmarks.harness.interleave`); ratios of every variant over "ours" are computed per round; torch.compile is
timed cold (fresh inductor cache dir for this process) and warm (after torch._dynamo.reset(),
cache on disk), and the steps to break even against the case's baseline are reported. A copy
(`y.copy_(x)`, 64 MiB) and a triad (`z = x + 3y`, TensorIterator's plain stores) measure this
machine's memory bandwidth per thread count, and every variant's bytes/time is shown as % of the
larger (the roofline of these memory-bound kernels). Both are two- and three-stream figures: on
a 2-vCPU Xeon VM one thread copied at 7.5-8.5 GB/s and ran the triad at 9.1-9.2 while AdamW's
seven streams moved 17-21 GB/s (one core's bandwidth grows with the misses it keeps in flight),
so a many-stream kernel can show over 100%.
Rows go to `benchmarks/results/<csv>` (long format, p20/p50/p80) with the allocator setting
(GLIBC_TUNABLES) and thread count in the notes.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # first, even when PYTHONPATH has it: benchmarks/kernels/ must not shadow kernels
# A fresh inductor cache, so the first torch.compile in this process is a cold compile.
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="fl_inductor_"))

import torch  # noqa: E402

from benchmarks.harness import append_rows, interleave, percentiles, print_table, timing_rows  # noqa: E402
from kernels import _alloc  # noqa: E402

FAMILIES: tuple[str, ...] = ("norms", "activations", "softmax", "rope", "cross_entropy", "optim")


def memory_bandwidth_gb_per_s(rounds: int = 7) -> dict[str, float]:
    """Median bytes moved / time, GB/s, of a 64 MiB fp32 copy (read + write) and a triad
    z = x + 3y (two reads, one write), interleaved, at the current thread count."""
    x = torch.randn(16 * 1024 * 1024)
    y, z = torch.randn_like(x), torch.empty_like(x)
    t = interleave({"y.copy_(x)": lambda: y.copy_(x), "z = x + 3y": lambda: torch.add(x, y, alpha=3.0, out=z)},
                   rounds=rounds, inner=3, warmup=2)
    moved = {"y.copy_(x)": 2 * x.numel() * 4, "z = x + 3y": 3 * x.numel() * 4}
    return {name: moved[name] / percentiles(t.wall_s[name])[1] / 1e9 for name in moved}


def _git_rev() -> str:
    """Short commit of the code being measured (+ "-dirty" with local changes), for the notes."""
    import subprocess

    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                             capture_output=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "kernels"], cwd=ROOT, text=True,
                               capture_output=True, timeout=10).stdout.strip()
        return (rev or "unknown") + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


REV = _git_rev()


def _auto_inner(fn, target_s: float = 0.02) -> int:
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    return max(1, min(50, int(target_s / max(dt, 1e-6))))


def _compile_variant(case: dict, rows: list, notes: str) -> tuple[dict, list[list]]:
    """Time torch.compile's first call cold and warm; return ({"compile": step}, table rows)."""
    import torch._dynamo

    make = case["compile"]
    step = make()
    t0 = time.perf_counter()
    step()
    cold_s = time.perf_counter() - t0
    torch._dynamo.reset()
    step = make()
    t0 = time.perf_counter()
    step()
    warm_s = time.perf_counter() - t0
    for metric, v in (("compile_cold_s", cold_s), ("compile_warm_s", warm_s)):
        rows.append(dict(benchmark=case["kernel"], variant="compile", shape=_shape(case), metric=metric,
                         p20=v, p50=v, p80=v, unit="s", notes=notes))
    return {"compile": step}, [["compile first call (cold/warm)", f"{cold_s:.2f} s / {warm_s:.2f} s"]]


def _shape(case: dict) -> str:
    return f"{case['shape']} {case['dtype']} {case['pass']}"


def run_case(case: dict, threads: int, bw_gb_per_s: float, rounds: int, use_compile: bool) -> list[dict]:
    """Benchmark one case; print its table; return its CSV rows."""
    malloc = os.environ.get("GLIBC_TUNABLES", "glibc-default")
    pool = "on" if _alloc.pool_status() is None else "off"  # large outputs from kernels' output pool
    notes = (f"threads={threads}; malloc={malloc}; output_pool={pool}; rev={REV}; order=shuffled; settle=1; "
             f"{case.get('notes', '')}").strip("; ")
    rows: list[dict] = []
    variants = dict(case["variants"])
    extra: list[list] = []
    compile_times = {}
    if use_compile and case.get("compile") is not None:
        try:
            more, extra = _compile_variant(case, rows, notes)
            variants.update(more)
            compile_times = {r["metric"]: r["p50"] for r in rows}
        except Exception as exc:  # a compile failure is a result, not a crash
            extra = [["compile", f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"]]
    inner = case.get("inner") or _auto_inner(variants["ours"])
    timing = interleave(variants, rounds=rounds, inner=inner, warmup=1, settle=1)
    rows += timing_rows(case["kernel"], _shape(case), timing, notes=notes)
    table = []
    for name in variants:
        p20, p50, p80 = percentiles(x * 1e3 for x in timing.wall_s[name])
        r = timing.ratio(name, "ours") if name != "ours" else (1.0, 1.0, 1.0)
        rc = timing.ratio(name, "ours", "cpu_s") if name != "ours" else (1.0, 1.0, 1.0)
        gbs = case.get("bytes", 0.0) / (p50 / 1e3) / 1e9 if case.get("bytes") else float("nan")
        table.append([name, p50, f"{p20:.3g}-{p80:.3g}", r[1], rc[1], gbs, 100 * gbs / bw_gb_per_s])
        if name != "ours":
            for metric, rr in (("speedup_wall", r), ("speedup_cpu", rc)):
                rows.append(dict(benchmark=case["kernel"], variant=f"ours_vs_{name}", shape=_shape(case),
                                 metric=metric, p20=rr[0], p50=rr[1], p80=rr[2], unit="x", notes=notes))
        if case.get("bytes"):
            rows.append(dict(benchmark=case["kernel"], variant=name, shape=_shape(case), metric="bandwidth",
                             p20=gbs, p50=gbs, p80=gbs, unit="GB/s",
                             notes=f"{notes}; mem_bw={bw_gb_per_s:.1f}GB/s"))
    base = case.get("baseline", "naive")
    if compile_times and base in timing.wall_s and "compile" in timing.wall_s:
        saving = percentiles(timing.wall_s[base])[1] - percentiles(timing.wall_s["compile"])[1]
        for kind in ("cold", "warm"):
            c = compile_times[f"compile_{kind}_s"]
            steps = c / saving if saving > 0 else float("inf")
            extra.append([f"steps to break even vs {base} ({kind})", f"{steps:.0f}"])
            rows.append(dict(benchmark=case["kernel"], variant="compile", shape=_shape(case),
                             metric=f"break_even_steps_{kind}", p20=steps, p50=steps, p80=steps,
                             unit="steps", notes=notes))
    print_table(f"{case['kernel']} {_shape(case)}  threads={threads}  malloc={malloc}  inner={inner}",
                ["variant", "p50 ms", "p20-p80 ms", "ours x (wall)", "ours x (cpu)", "GB/s", "% mem bw"],
                table)
    for label, value in extra:
        print(f"  {label}: {value}")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", action="append", help="family module(s) under benchmarks/kernels")
    ap.add_argument("--threads", default=f"1,{os.cpu_count()}", help="comma-separated thread counts")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="ask families for fewer/smaller cases")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    ap.add_argument("--csv", default="kernels.csv")
    args = ap.parse_args(argv)
    if args.quick:
        os.environ["FL_BENCH_QUICK"] = "1"
    families = args.family or [f for f in FAMILIES if (ROOT / "benchmarks" / "kernels" / f"{f}.py").exists()]
    try:  # load the C++ extension first: it attaches the output pool the rows' notes name
        from kernels._build import load_cpu_ops

        load_cpu_ops()
    except RuntimeError as exc:
        print(f"cpu provider unavailable ({exc}): its rows fall back", file=sys.stderr)
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        measured = memory_bandwidth_gb_per_s()
        bw = max(measured.values())
        print(f"\n== threads={threads}: measured memory bandwidth {bw:.1f} GB/s (64 MiB fp32: "
              + ", ".join(f"{name} {v:.1f}" for name, v in measured.items()) + ") ==")
        malloc = os.environ.get("GLIBC_TUNABLES", "glibc-default")
        append_rows(args.csv, [dict(benchmark="copy", variant=name, shape="16777216 float32", metric="bandwidth",
                                    p20=v, p50=v, p80=v, unit="GB/s", notes=f"threads={threads}; malloc={malloc}")
                               for name, v in measured.items()])
        for fam in families:
            module = importlib.import_module(f"benchmarks.kernels.{fam}")
            for case in module.cases(threads):
                rows = run_case(case, threads, bw, args.rounds, not args.no_compile)
                append_rows(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
