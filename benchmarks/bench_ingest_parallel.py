#!/usr/bin/env python3
"""Benchmark serial vs parallel FusionLens ingestion of the big plain-JSON traces (and json.loads).

Focused companion of `bench_ingest.py` (which also runs HTA, json+DataFrame and DuckDB): each run
is a fresh subprocess; variants are interleaved round by round:
- `fusionlens-serial`: `load_trace(path, workers=1)` (one process)
- `fusionlens-parallel`: `load_trace(path, workers=N)` (this process + N-1 worker processes)
- `json.loads` (500 MB only): the reference for "ingestion <= 0.5x json.loads"
Wall and CPU time (worker processes included) and peak RSS of the whole process tree are reported:
`peak_rss` is the tree's RSS sampled every 10 ms, `peak_rss_bound` the caller's VmHWM plus the
largest worker's (an upper bound: as if both peaked at once). Ratios pair runs of the same round.

    .venv/bin/python benchmarks/bench_ingest_parallel.py [--rounds 3] [--workers 2] [--sizes 1000,500]
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

from benchmarks.bench_ingest import big_trace  # noqa: E402
from benchmarks.harness import append_rows, machine, percentiles, print_table  # noqa: E402

RUN = r'''
import json, resource, sys, threading, time
import psutil
variant, path, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
if variant.startswith("fusionlens"):
    from profiler.trace import load_trace
    n = 1 if variant == "fusionlens-serial" else workers
    def run():
        return len(load_trace(path, workers=n).events)
else:
    def run():
        with open(path, "rb") as fh:
            return len(json.loads(fh.read())["traceEvents"])
me, peak, done = psutil.Process(), [0], threading.Event()
def sample():
    while not done.wait(0.01):
        try:
            rss = me.memory_info().rss + sum(c.memory_info().rss for c in me.children(recursive=True))
        except psutil.Error:
            continue
        peak[0] = max(peak[0], rss)
t = threading.Thread(target=sample, daemon=True)
t.start()
c0, w0 = time.process_time(), time.perf_counter()
ch0 = resource.getrusage(resource.RUSAGE_CHILDREN)
rows = run()
w1, c1 = time.perf_counter(), time.process_time()
done.set(); t.join()
ch = resource.getrusage(resource.RUSAGE_CHILDREN)
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) / 1024.0
child_cpu = (ch.ru_utime + ch.ru_stime) - (ch0.ru_utime + ch0.ru_stime)
print(json.dumps({"wall_s": w1 - w0, "cpu_s": c1 - c0 + child_cpu, "rows": rows,
                  "rss_peak_mb": max(peak[0] / 2**20, hwm), "rss_bound_mb": hwm + ch.ru_maxrss / 1024.0}))
'''


def run_once(variant: str, path: Path, workers: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", RUN, variant, str(path), str(workers)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} failed: {proc.stderr.strip()[-400:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--sizes", default="1000,500", help="MB targets of the cached big traces")
    a = ap.parse_args(argv)
    print(f"machine: {machine()}")
    rows, table = [], []
    for target in (float(s) for s in a.sizes.split(",")):
        path = big_trace(target)
        size_mb = path.stat().st_size / 1e6
        variants = ["fusionlens-serial", "fusionlens-parallel"] + (["json.loads"] if target <= 600 else [])
        res: dict[str, list[dict]] = {v: [] for v in variants}
        for r in range(a.rounds):
            for v in variants:
                out = run_once(v, path, a.workers)
                res[v].append(out)
                print(f"  {size_mb:.0f} MB round {r + 1}: {v:20s} wall {out['wall_s']:6.2f} s  cpu {out['cpu_s']:6.2f} s"
                      f"  peak RSS {out['rss_peak_mb']:6.0f} MB (bound {out['rss_bound_mb']:6.0f})  rows {out['rows']:,}")
        shape = f"{size_mb:.0f}MB_json"
        notes = f"plain .json; workers={a.workers}; fresh subprocess per run; n={a.rounds}; load1={os.getloadavg()[0]:.2f}"
        for v, runs in res.items():
            stats = {"wall_time": ("s", [x["wall_s"] for x in runs]), "cpu_time": ("s", [x["cpu_s"] for x in runs]),
                     "peak_rss": ("MB", [x["rss_peak_mb"] for x in runs]),
                     "peak_rss_bound": ("MB", [x["rss_bound_mb"] for x in runs]),
                     "peak_rss_per_input_size": ("x", [x["rss_peak_mb"] / size_mb for x in runs]),
                     "throughput": ("MB/s", [size_mb / x["wall_s"] for x in runs])}
            for v2 in variants:
                if v2 != v:
                    stats[f"wall_vs_{v2}"] = ("x", [x["wall_s"] / y["wall_s"] for x, y in zip(runs, res[v2])])
                    stats[f"cpu_vs_{v2}"] = ("x", [x["cpu_s"] / y["cpu_s"] for x, y in zip(runs, res[v2])])
            p = {m: percentiles(xs) for m, (_, xs) in stats.items()}
            for m, (unit, _) in stats.items():
                rows.append(dict(benchmark="ingest", variant=v, shape=shape, metric=m, p20=p[m][0], p50=p[m][1],
                                 p80=p[m][2], unit=unit, notes=notes))
            table.append([shape, v, p["wall_time"][1], p["wall_time"][0], p["wall_time"][2], p["cpu_time"][1],
                          p["peak_rss"][1], p["peak_rss_bound"][1], p["peak_rss_per_input_size"][1],
                          p.get("wall_vs_json.loads", ("-",) * 3)[1], p.get("cpu_vs_json.loads", ("-",) * 3)[1]])
    print_table("Ingestion, serial vs parallel; medians (p20/p80 of wall)",
                ["shape", "variant", "wall s", "p20", "p80", "cpu s", "peak RSS MB", "RSS bound", "RSS/size",
                 "wall/json.loads", "cpu/json.loads"], table)
    print(f"appended {len(rows)} rows to {append_rows('ingest.csv', rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
