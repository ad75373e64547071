"""Fresh kernel-output cost on CPU: the output pool, transparent-huge-page advice, plain (`kernels/_alloc.py`).

Usage (from the repo root):
    .venv/bin/python benchmarks/bench_alloc.py [--sizes-mb 1,4,16,64,256] [--threads 1,2]
        [--rounds 9] [--skip-kernels] [--skip-rss]

Three parts, each interleaved round by round (`benchmarks.harness`), rows appended to
`benchmarks/results/alloc.csv`:
1. fresh output by size: allocate + write once (`fill_`) + free, per call: `plain` (torch.empty),
   `advised` (torch.empty + MADV_HUGEPAGE on the aligned interior, at any size: shows where the
   advice starts to pay, i.e. the threshold), `pooled` (`kernels._alloc.empty`, the product's
   road: the C++ extension's caching pool from 4 MiB up), `prealloc` (writing a buffer allocated
   once: the floor). Whether glibc mmaps a block (fresh pages, faults) or reuses its heap depends on its
   adaptive threshold; run again with GLIBC_TUNABLES=glibc.malloc.mmap_threshold=524288 to see
   the cost of a fresh mapping at the small sizes (the setting is recorded in every row).
2. end-to-end public-API kernel calls (fp32, no_grad): pooled (the default), pool off with the
   advice on (FUSIONLENS_CPU_POOL=0), both off (and FUSIONLENS_HUGEPAGES=0), next to the ATen op,
   at each thread count.
3. RSS: a child process per setting runs the same kernel calls and reports peak and final RSS
   and AnonHugePages (pooled, advice only, plain); the pooled child also reports its RSS after
   `kernels.empty_output_pool()`.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # first, even when PYTHONPATH has it: benchmarks/kernels/ must not shadow kernels

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import kernels  # noqa: E402
from benchmarks.harness import append_rows, interleave, percentiles, print_table, timing_rows  # noqa: E402
from kernels import _alloc  # noqa: E402

CSV = "alloc.csv"
CPU = torch.device("cpu")
MALLOC = os.environ.get("GLIBC_TUNABLES", "glibc-default")


def _notes(threads: int, extra: str = "") -> str:
    return f"threads={threads}; malloc={MALLOC}; thp={_alloc.THP_ENABLED.read_text().strip() if _alloc.THP_ENABLED.exists() else 'n/a'}; min_bytes={_alloc.HUGEPAGE_MIN_BYTES}; {extra}".strip("; ")


def _ratio_row(bench: str, shape: str, variant: str, r: tuple[float, float, float], metric: str, notes: str) -> dict:
    return dict(benchmark=bench, variant=variant, shape=shape, metric=metric, p20=r[0], p50=r[1], p80=r[2],
                unit="x", notes=notes)


def fresh_outputs(sizes_mb: list[float], threads: int, rounds: int) -> None:
    """Part 1: allocate + first write + free, by size."""
    torch.set_num_threads(threads)
    for mb in sizes_mb:
        n = int(mb * (1 << 20)) // 4
        pre = torch.empty(n)
        pre.fill_(0.0)  # faulted in once, outside the timing

        def plain():
            torch.empty(n).fill_(1.0)

        def advised():
            t = torch.empty(n)
            _alloc.advise_hugepages(t)
            t.fill_(1.0)

        def pooled():
            _alloc.empty((n,), torch.float32, CPU).fill_(1.0)

        def prealloc():
            pre.fill_(1.0)

        inner = max(1, min(50, int(64 / max(mb, 0.25))))
        timing = interleave({"plain": plain, "advised": advised, "pooled": pooled, "prealloc": prealloc},
                            rounds=rounds, inner=inner, warmup=2)
        shape, notes = f"{mb:g} MiB fp32", _notes(threads, f"inner={inner}")
        rows = timing_rows("fresh_output", shape, timing, notes=notes)
        table = []
        for name in timing.wall_s:
            p20, p50, p80 = percentiles(x * 1e3 for x in timing.wall_s[name])
            r = timing.ratio("plain", name) if name != "plain" else (1.0, 1.0, 1.0)
            rc = timing.ratio("plain", name, "cpu_s") if name != "plain" else (1.0, 1.0, 1.0)
            table.append([name, p50, f"{p20:.3g}-{p80:.3g}", r[1], rc[1]])
            if name != "plain":
                rows.append(_ratio_row("fresh_output", shape, f"{name}_vs_plain", r, "speedup_wall", notes))
                rows.append(_ratio_row("fresh_output", shape, f"{name}_vs_plain", rc, "speedup_cpu", notes))
        append_rows(CSV, rows)
        print_table(f"fresh output {mb:g} MiB  threads={threads}  malloc={MALLOC}  inner={inner}",
                    ["variant", "p50 ms", "p20-p80 ms", "plain / variant (wall)", "(cpu)"], table)


def _kernel_cases() -> list[tuple[str, tuple, object, object]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 3072, generator=g)
    b = torch.randn(4096, 3072, generator=g)
    s = torch.randn(8, 12, 512, 512, generator=g)
    return [
        ("gelu", (4096, 3072), lambda: kernels.gelu(x), lambda: F.gelu(x)),
        ("swiglu", (4096, 3072), lambda: kernels.swiglu(x, b), lambda: F.silu(x) * b),
        ("softmax", (8, 12, 512, 512), lambda: kernels.softmax(s), lambda: torch.softmax(s, -1)),
    ]


ENV_KEYS = ("FUSIONLENS_CPU_POOL", "FUSIONLENS_HUGEPAGES")
SETTINGS = {"pooled": ("1", "1"), "hugepages": ("0", "1"), "plain": ("0", "0")}  # (pool, advice)


def _with_env(setting: str, fn):
    def run():
        os.environ.update(zip(ENV_KEYS, SETTINGS[setting]))
        with torch.no_grad():
            fn()
    return run


def kernel_calls(threads: int, rounds: int) -> None:
    """Part 2: public-API calls pooled / advice only / plain, and the ATen op, interleaved."""
    torch.set_num_threads(threads)
    saved = {k: os.environ.get(k) for k in ENV_KEYS}
    try:
        for name, shape, ours, aten in _kernel_cases():
            variants = {f"ours_{v}": _with_env(v, ours) for v in SETTINGS}
            variants["aten"] = _with_env("pooled", aten)
            timing = interleave(variants, rounds=rounds, inner=3, warmup=2)
            shp, notes = "x".join(map(str, shape)) + " fp32 fwd", _notes(threads)
            rows = timing_rows(f"kernel_{name}", shp, timing, notes=notes)
            table = []
            for v in variants:
                p20, p50, p80 = percentiles(t * 1e3 for t in timing.wall_s[v])
                vs_aten = timing.ratio("aten", v)
                vs_aten_cpu = timing.ratio("aten", v, "cpu_s")
                table.append([v, p50, f"{p20:.3g}-{p80:.3g}", vs_aten[1], vs_aten_cpu[1]])
                if v != "aten":
                    rows.append(_ratio_row(f"kernel_{name}", shp, f"{v}_vs_aten", vs_aten, "speedup_wall", notes))
                    rows.append(_ratio_row(f"kernel_{name}", shp, f"{v}_vs_aten", vs_aten_cpu, "speedup_cpu", notes))
            r = timing.ratio("ours_plain", "ours_hugepages")
            rp = timing.ratio("ours_hugepages", "ours_pooled")
            rows.append(_ratio_row(f"kernel_{name}", shp, "hugepages_vs_plain", r, "speedup_wall", notes))
            rows.append(_ratio_row(f"kernel_{name}", shp, "pooled_vs_hugepages", rp, "speedup_wall", notes))
            append_rows(CSV, rows)
            print_table(f"{name} {shp}  threads={threads}  malloc={MALLOC}",
                        ["variant", "p50 ms", "p20-p80 ms", "aten / variant (wall)", "(cpu)"], table)
            print(f"  huge pages on vs off (wall): {r[1]:.2f}x (p20 {r[0]:.2f}, p80 {r[2]:.2f}); "
                  f"pooled vs advice only: {rp[1]:.2f}x (p20 {rp[0]:.2f}, p80 {rp[2]:.2f})")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_RSS_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
import kernels
from benchmarks.bench_alloc import _kernel_cases
def status():
    out = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(v.split()[0]) / 1024
    out["AnonHugePages"] = sum(int(l.split()[1]) for l in open("/proc/self/smaps_rollup")
                               if l.startswith("AnonHugePages:")) / 1024
    return out
torch.set_num_threads(1)
cases = _kernel_cases()
before = status()
with torch.no_grad():
    for _ in range(10):
        live = [ours() for _, _, ours, _ in cases]  # the last round's outputs stay alive
live_status = status()
del live
after = status()
kernels.empty_output_pool()
emptied = status()
print(json.dumps({"inputs_rss_mb": before["VmRSS"], "peak_rss_mb": after["VmHWM"],
                  "with_outputs_rss_mb": live_status["VmRSS"], "final_rss_mb": after["VmRSS"],
                  "after_empty_output_pool_rss_mb": emptied["VmRSS"],
                  "anon_huge_with_outputs_mb": live_status["AnonHugePages"]}))
"""


def rss(threads: int = 1) -> None:
    """Part 3: peak/final RSS of 10 rounds of the kernel calls, per setting (child processes)."""
    table, rows = [], []
    for label, values in SETTINGS.items():
        env = dict(os.environ, **dict(zip(ENV_KEYS, values)))
        out = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(ROOT)], env=env, capture_output=True,
                             text=True, timeout=600, cwd=ROOT)
        if out.returncode != 0:
            raise SystemExit(f"RSS child failed: {out.stderr.strip().splitlines()[-1]}")
        res = json.loads(out.stdout.strip().splitlines()[-1])
        table.append([label] + [res[k] for k in ("inputs_rss_mb", "peak_rss_mb", "with_outputs_rss_mb",
                                                 "final_rss_mb", "after_empty_output_pool_rss_mb",
                                                 "anon_huge_with_outputs_mb")])
        for k, v in res.items():
            rows.append(dict(benchmark="rss_kernel_loop", variant=label, shape="gelu+swiglu+softmax x10",
                             metric=k.removesuffix("_mb"), p20=v, p50=v, p80=v, unit="MiB", notes=_notes(threads)))
    append_rows(CSV, rows)
    print_table(f"RSS over 10 rounds of gelu/swiglu/softmax (MiB)  malloc={MALLOC}",
                ["variant", "after inputs", "peak", "outputs alive", "final", "after empty_output_pool",
                 "AnonHugePages (alive)"], table)


def main(argv: list[str] | None = None) -> int:
    global CSV
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", default="1,4,16,64,256")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--skip-kernels", action="store_true")
    ap.add_argument("--skip-rss", action="store_true")
    ap.add_argument("--csv", default=CSV, help="results file under benchmarks/results")
    args = ap.parse_args(argv)
    CSV = args.csv
    from kernels._build import load_cpu_ops

    load_cpu_ops()  # attaches the output pool
    print(f"huge-page advice: {_alloc.hugepage_status() or 'on'}; output pool: {_alloc.pool_status() or 'on'}; "
          f"load average {os.getloadavg()}")
    sizes = [float(s) for s in args.sizes_mb.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    for t in threads:
        fresh_outputs(sizes, t, args.rounds)
    if not args.skip_kernels:
        for t in threads:
            kernel_calls(t, args.rounds)
    if not args.skip_rss:
        rss()
    print(f"\nrows appended to benchmarks/results/{CSV}; load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
