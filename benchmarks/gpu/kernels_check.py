"""GPU check of the Triton kernels (run by benchmarks/gpu_check.sh on a lent NVIDIA GPU).

1. Correctness at real sizes: every `gpu_checks(device)` of the family modules in
   `benchmarks/kernels/` (each a zero-arg callable that raises on a mismatch vs float64).
2. Device-to-device copy bandwidth (1 GiB `y.copy_(x)`, CUDA events): the roof of these
   memory-bound kernels.
3. Speed: every `gpu_cases(device)` (same dict contract as `cases`, see
   `benchmarks/kernels/__init__.py`), variants interleaved round by round, timed with CUDA events,
   plus torch.compile of the reference (compile time reported separately) for the first case of
   each family while the first half of the time budget lasts. Prints p50 time, GB/s, % of the copy bandwidth and every variant's time over ours.

Writes `<out>/kernels_gpu.csv` (benchmarks.harness columns: date, machine = GPU name) and
`<out>/kernels_gpu.md` (tables titled with the GPU name and date), rewritten after every case.
Usage: python benchmarks/gpu/kernels_check.py --out DIR [--budget-s 80] [--family norms] [--skip-checks]
Without a CUDA GPU it says so and exits 0 (nothing to check).
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import importlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # first, even when PYTHONPATH has it: benchmarks/kernels/ must not shadow kernels

import torch  # noqa: E402

from benchmarks.harness import CSV_COLUMNS, percentiles  # noqa: E402

FAMILIES = ("norms", "activations", "softmax", "rope", "cross_entropy", "optim", "norms_warps")  # the sweep last: it uses what budget is left


_L2_FLUSH: dict[str, torch.Tensor] = {}


def _flush_l2(device: str) -> None:
    """Overwrite a 256 MiB buffer (larger than any current GPU's L2: 50 MB on H100, 60 on B200), so
    each timed call reads its inputs from HBM, as a real model step does (triton's do_bench does
    the same)."""
    buf = _L2_FLUSH.get(device)
    if buf is None:
        buf = _L2_FLUSH[device] = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device=device)
    buf.zero_()


def cuda_time_s(fn, inner: int, device: str = "cuda", flush: bool = True) -> float:
    """Median seconds of one call of fn over `inner` calls, each with the L2 flushed before it and
    timed alone by its own pair of CUDA events (the flush is outside the timed interval)."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(inner)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(inner)]
    for i in range(inner):
        if flush:
            _flush_l2(device)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return percentiles(s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends))[1]


def interleave_cuda(variants: dict, rounds: int, inner: int, flush: bool = True) -> dict[str, list[float]]:
    """Per-variant seconds per call (one sample per round), variants interleaved round by round."""
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():
        fn()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, fn in variants.items():
            samples[name].append(cuda_time_s(fn, inner, flush=flush))
    return samples


def copy_bandwidth_gb_per_s(device: str) -> float:
    x = torch.empty(256 * 1024 * 1024, dtype=torch.float32, device=device).normal_()
    y = torch.empty_like(x)
    s = interleave_cuda({"copy": lambda: y.copy_(x)}, rounds=5, inner=5, flush=False)["copy"]
    bw = 2 * x.numel() * 4 / percentiles(s)[1] / 1e9
    del x, y
    torch.cuda.empty_cache()
    return bw


def _working(variants: dict) -> tuple[dict, dict[str, str]]:
    """Run each variant once; drop the ones that fail (a missing or broken third-party kernel)."""
    ok, failed = {}, {}
    for name, fn in variants.items():
        try:
            fn()
            ok[name] = fn
        except Exception as exc:  # recorded and shown, not fatal
            failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
    torch.cuda.synchronize()
    return ok, failed


def run_checks(modules, device: str) -> list[list[str]]:
    table = []
    for mod in modules:
        for name, check in getattr(mod, "gpu_checks", lambda d: [])(device):
            t0 = time.perf_counter()
            try:
                check()
                result = "PASS"
            except Exception as exc:
                result = f"FAIL {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            table.append([name, result, f"{time.perf_counter() - t0:.1f}s"])
            print(f"  check {name}: {result}", flush=True)
    return table


def bench_case(case: dict, bw: float, compile_ok: bool, rows: list, gpu: str) -> list[list]:
    shape = f"{case['shape']} {case['dtype']} {case['pass']}"
    variants, failed = _working(dict(case["variants"]))
    if compile_ok and case.get("compile"):
        try:
            t0 = time.perf_counter()
            step = case["compile"]()
            step()
            torch.cuda.synchronize()
            rows.append(_row(case["kernel"], "compile", shape, "compile_cold_s", time.perf_counter() - t0, "s", gpu))
            variants["compile"] = step
        except Exception as exc:
            failed["compile"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
    table = []
    if "ours" not in variants:  # our kernel failed to run: record why, keep the other cases going
        return [[case["kernel"], shape, name, "failed", "", "", why] for name, why in failed.items()]
    samples = interleave_cuda(variants, rounds=5, inner=10)
    ours = samples["ours"]
    for name, s in samples.items():
        p20, p50, p80 = percentiles(s)
        ratio = percentiles(a / b for a, b in zip(s, ours))[1]
        gbs = case.get("bytes", 0.0) / p50 / 1e9
        rows.append(_row(case["kernel"], name, shape, "time", p50 * 1e3, "ms", gpu, p20 * 1e3, p80 * 1e3))
        rows.append(_row(case["kernel"], name, shape, "bandwidth_pct_of_copy", 100 * gbs / bw, "%", gpu))
        if name != "ours":
            rows.append(_row(case["kernel"], f"ours_vs_{name}", shape, "speedup", ratio, "x", gpu))
        table.append([case["kernel"], shape, name, f"{p50 * 1e3:.3f}", f"{gbs:.0f}", f"{100 * gbs / bw:.0f}%",
                      f"{ratio:.2f}x"])
    for name, why in failed.items():
        table.append([case["kernel"], shape, name, "failed", "", "", why])
    return table


def _row(kernel, variant, shape, metric, p50, unit, gpu, p20=None, p80=None) -> dict:
    return dict(date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), machine=gpu,
                benchmark=kernel, variant=variant, shape=shape, metric=metric,
                p20=f"{p50 if p20 is None else p20:.6g}", p50=f"{p50:.6g}", p80=f"{p50 if p80 is None else p80:.6g}",
                unit=unit, notes="triton provider; CUDA events per call, L2 flushed before each; interleaved 5 rounds x 10 calls")


def compiled_resources() -> list[dict]:
    """Every variant of our Triton kernels this process compiled: warps and shared memory, and,
    once the driver has loaded it, registers and local memory (spills) per thread as the driver
    reports them, to set beside the ahead-of-time table (benchmarks/results/triton_aot_sm90.csv)."""
    from triton.runtime.jit import JITFunction

    from tests.kernels.triton_aot import TRITON_MODULES, describe

    out = []
    for module_name in TRITON_MODULES:
        module = sys.modules.get(module_name)
        for fn in (vars(module).values() if module else ()):
            if not isinstance(fn, JITFunction):
                continue
            for cache, *_ in list(fn.device_caches.values()):
                for k in list(cache.values()):
                    src = getattr(k, "src", None)
                    desc = describe(src.signature, src.constants, src.attrs, fn.params)[0] if src else ""
                    meta = getattr(k, "metadata", None)
                    out.append({"kernel": f"{module_name.rsplit('.', 1)[-1]}.{fn.__name__}", "constexprs": desc,
                                "num_warps": getattr(meta, "num_warps", None), "shared": getattr(meta, "shared", None),
                                "registers": getattr(k, "n_regs", None), "local_bytes": getattr(k, "n_spills", None)})
    return out


def _markdown(title: str, header: list[str], table: list[list]) -> str:
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in table]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="GPU check of the Triton kernels")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--budget-s", type=float, default=80.0)
    ap.add_argument("--family", action="append")
    ap.add_argument("--skip-checks", action="store_true",
                    help="skip the gpu_checks (gpu_check.sh's kernel_tests step already ran them under pytest)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernels_check: no CUDA GPU here, nothing to check")
        return 0
    t_start = time.perf_counter()
    device, gpu = "cuda", torch.cuda.get_device_name(0)
    args.out.mkdir(parents=True, exist_ok=True)
    modules = []
    for fam in args.family or FAMILIES:
        try:
            modules.append(importlib.import_module(f"benchmarks.kernels.{fam}"))
        except ModuleNotFoundError:
            continue
        except Exception as exc:  # one broken family must not hide the others' results
            print(f"kernels_check: skipping family {fam}: {type(exc).__name__}: {exc}", flush=True)
    print(f"kernels_check on {gpu}: families {[m.__name__.rsplit('.', 1)[-1] for m in modules]}", flush=True)
    checks = ([["gpu_checks", "skipped: the kernel_tests step runs them (pytest -k cuda, gpu_check.log)", ""]]
              if args.skip_checks else run_checks(modules, device))
    bw = copy_bandwidth_gb_per_s(device)
    print(f"D2D copy bandwidth: {bw:.0f} GB/s", flush=True)
    rows = [_row("copy", "y.copy_(x)", "268435456 float32", "bandwidth", bw, "GB/s", gpu)]
    table: list[list] = []
    _write(args.out, gpu, bw, checks, table, rows)  # the checks are saved even if a timeout follows
    for mod in modules:
        compiled = False  # one torch.compile (a cold compile costs 5-20 s) per family, in the first half
        for case in getattr(mod, "gpu_cases", lambda d: [])(device):
            elapsed = time.perf_counter() - t_start
            if elapsed > args.budget_s:
                print(f"  budget of {args.budget_s:.0f} s spent: stopping before {case['kernel']}")
                break
            compile_ok = not compiled and bool(case.get("compile")) and elapsed < 0.5 * args.budget_s
            compiled = compiled or compile_ok
            try:
                table += bench_case(case, bw, compile_ok, rows, gpu)
            except Exception as exc:  # e.g. out of memory: keep the other cases' numbers
                table.append([case["kernel"], str(case.get("shape")), "all", "failed", "", "",
                              f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"])
                torch.cuda.empty_cache()
            print("  " + " | ".join(table[-1]), flush=True)
            _write(args.out, gpu, bw, checks, table, rows)
    try:  # what the driver says each compiled variant uses (never fails the check)
        resources = compiled_resources()
    except Exception as exc:
        resources = []
        print(f"kernels_check: compiled_resources: {type(exc).__name__}: {exc}")
    for r in resources:
        variant = f"{r['constexprs']} warps={r['num_warps']}"
        rows += [_row(r["kernel"], variant, "", metric, r[key], unit, gpu)
                 for key, metric, unit in (("registers", "registers_per_thread", "regs"),
                                           ("local_bytes", "local_bytes_per_thread", "B"), ("shared", "shared_bytes", "B"))
                 if r[key] is not None]
    print(_write(args.out, gpu, bw, checks, table, rows, resources))
    return 1 if any(r[1].startswith("FAIL") for r in checks) else 0


def _write(out: Path, gpu: str, bw: float, checks: list, table: list, rows: list,
           resources: list[dict] | None = None) -> str:
    """(Re)write kernels_gpu.md and kernels_gpu.csv with everything measured so far."""
    header = ["kernel", "shape", "variant", "p50 ms", "GB/s", "% copy bw", "time / ours"]
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    md = _markdown(f"Kernel checks on {gpu}, {date}", ["check", "result", "time"], checks)
    md += "\n" + _markdown(f"Kernel speed on {gpu}, {date} (D2D copy {bw:.0f} GB/s)", header, table)
    if resources:
        md += "\n" + _markdown(f"Compiled Triton variants on {gpu}, {date} (driver-reported; compare "
                               "benchmarks/results/triton_aot_sm90.csv)",
                               ["kernel", "constexprs", "warps", "registers", "local B/thread", "shared B"],
                               [[r["kernel"], r["constexprs"], r["num_warps"], r["registers"], r["local_bytes"],
                                 r["shared"]] for r in resources])
    (out / "kernels_gpu.md").write_text(md)
    with (out / "kernels_gpu.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return md


if __name__ == "__main__":
    sys.exit(main())
