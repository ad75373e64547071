#!/usr/bin/env python3
"""Benchmark trace ingestion on a ~500 MB Kineto trace: FusionLens vs the usual ways.

Variants, each run in its own fresh subprocess so peak RSS is that variant's alone:
- `fusionlens`: `profiler.trace.load_trace` (msgspec typed decoding of 4 MB chunks into columns;
  a plain .json this large is decoded by one worker process per CPU: CPU and RSS include them)
- `json.loads`, `json.loads+DataFrame` (one dict per event, then `pd.DataFrame(traceEvents)`)
- `orjson.loads` alone (the fastest generic parser: a floor for "parse everything")
- `duckdb.read_json`: the other columnar approach measured for the design (same kept fields)
- `hta.TraceAnalysis`: HolisticTraceAnalysis, in its own venv under benchmarks/.cache (it needs
  pandas < 3); skipped with a printed reason when that venv cannot be made.
- `fusionlens.float_ts` (with `--float-ts`): `load_trace` with every `ts` parsed as float64, as
  before exact epoch timestamps; on an epoch-µs trace (`--source hta_v100_ns_resolution_rank-0...`)
  this is what keeping the timestamps exact costs.

Cheap variants run interleaved for `--rounds` rounds and the slow ones for `--slow-rounds`; ratios
are computed round by round against `fusionlens` in the same round. Wall time, CPU time (robust on
a shared machine), MB/s of uncompressed JSON and peak RSS are reported and appended to
`benchmarks/results/ingest.csv`. The big trace is made once by `benchmarks/make_big_trace.py` from
a real trace and cached in `benchmarks/.cache/`.

    .venv/bin/python benchmarks/bench_ingest.py [--target-mb 500] [--rounds 3] [--one-gb]
    .venv/bin/python benchmarks/bench_ingest.py --source hta_v100_ns_resolution_rank-0.pt.trace.json.gz \
        --float-ts --target-mb 200 --rounds 5 --slow-rounds 0 --no-hta     # exact epoch timestamps
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # first, even when PYTHONPATH has it: benchmarks/kernels/ must not shadow kernels

from benchmarks.harness import append_rows, machine, percentiles, print_table  # noqa: E402
from benchmarks.make_big_trace import make_big_trace  # noqa: E402

CACHE = ROOT / "benchmarks" / ".cache"
TRACE_DIRS = (Path("/work/shared/traces"), ROOT / "tests" / "data" / "traces")  # optional, fallback
SOURCE_NAME = "hta_v100_rank1of2_trace_diff_test.json.gz"
HTA_VENV = CACHE / "hta-venv"
HTA_PINS = ("pandas==2.3.3", "numpy==2.4.6", "plotly==7.1.0", "networkx==3.6.1", "PyYAML==6.0.4",
            "psutil==7.2.2", "pydot==4.0.1")
HTA_PKG = "HolisticTraceAnalysis==0.5.0"

# Runs inside each subprocess (stdlib at top level, so the HTA venv can run it too): imports
# first (untimed), then times one load and prints one JSON line.
WORKER = r'''
import json, resource, sys, time
variant, path = sys.argv[1], sys.argv[2]
def peak_mb():
    # VmHWM: this address space's peak RSS (ru_maxrss would include the parent's RSS at fork),
    # plus the largest child's (fusionlens's decode workers, HTA's pool): an upper bound.
    with open("/proc/self/status") as fh:
        hwm = next(int(l.split()[1]) for l in fh if l.startswith("VmHWM:"))
    return (hwm + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 1024.0
def child_cpu():
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime
if variant == "fusionlens":
    from profiler.trace import load_trace
    def run():
        return len(load_trace(path).events)
elif variant == "fusionlens.float_ts":
    from profiler.trace import decode, load_trace
    decode.ts_base = lambda view: None  # never exact: ts parsed as float64 (workers follow the caller)
    def run():
        return len(load_trace(path).events)
elif variant == "json.loads":
    def run():
        with open(path, "rb") as fh:
            return len(json.loads(fh.read())["traceEvents"])
elif variant == "json.loads+DataFrame":
    import pandas as pd
    def run():
        with open(path, "rb") as fh:
            doc = json.loads(fh.read())
        return len(pd.DataFrame(doc["traceEvents"]))
elif variant == "orjson.loads":
    import orjson
    def run():
        with open(path, "rb") as fh:
            return len(orjson.loads(fh.read())["traceEvents"])
elif variant == "duckdb.read_json":
    import duckdb
    from benchmarks.bench_ingest import duckdb_query
    con = duckdb.connect()
    con.execute("SET threads=2")
    def run():
        return con.sql(duckdb_query(path)).to_arrow_table().num_rows
elif variant == "hta.TraceAnalysis":
    import logging, os
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis
    def run():
        ta = TraceAnalysis(trace_dir=os.path.dirname(path))
        return sum(len(t) for t in ta.t.traces.values())
base = peak_mb()
c0, w0 = time.process_time() + child_cpu(), time.perf_counter()
rows = run()
w1, c1 = time.perf_counter(), time.process_time() + child_cpu()
print(json.dumps({"wall_s": w1 - w0, "cpu_s": c1 - c0, "rows": rows, "rss_base_mb": base,
                  "rss_peak_mb": peak_mb()}))
'''

DUCK_ARGS = (("External id", "BIGINT"), ("correlation", "BIGINT"), ("device", "VARCHAR"),
             ("stream", "VARCHAR"), ("grid", "BIGINT[]"), ("block", "BIGINT[]"),
             ("registers per thread", "BIGINT"), ("shared memory", "BIGINT"), ("blocks per SM", "DOUBLE"),
             ("warps per SM", "DOUBLE"), ("est. achieved occupancy %", "DOUBLE"), ("bytes", "VARCHAR"),
             ("memory bandwidth (GB/s)", "DOUBLE"), ("Sequence number", "BIGINT"), ("Fwd thread id", "BIGINT"),
             ("Input Dims", "JSON"), ("Input type", "JSON"))


def duckdb_query(path: str) -> str:
    """DuckDB reading the same kept fields as FusionLens, as columns (complete events only).

    Note: DuckDB struct keys are case-insensitive, so the 2021 format's lower-case "external id"
    cannot sit beside "External id" in one STRUCT: one reason this approach lost besides speed.
    """
    args = ", ".join(f'"{k}" {t}' for k, t in DUCK_ARGS)
    ev = (f"STRUCT(ph VARCHAR, cat VARCHAR, name VARCHAR, ts DOUBLE, dur DOUBLE, pid VARCHAR, tid VARCHAR, "
          f"id BIGINT, args STRUCT({args}))")
    sel = ", ".join(f'e.args."{k}" AS "{k}"' for k, _ in DUCK_ARGS)
    src = str(path).replace("'", "''")
    return (f"SELECT e.cat, e.name, e.ts, e.dur, e.pid, e.tid, {sel} FROM (SELECT unnest(traceEvents) AS e "
            f"FROM read_json('{src}', columns={{traceEvents: '{ev}[]'}}, format='unstructured', "
            f"maximum_object_size=4000000000)) WHERE e.ph = 'X'")


def source_trace(name: str = SOURCE_NAME) -> Path:
    for d in TRACE_DIRS:
        if (d / name).is_file():
            return d / name
    raise SystemExit(f"cannot find {name} in {', '.join(map(str, TRACE_DIRS))}")


def big_trace(target_mb: float, source: str = SOURCE_NAME) -> Path:
    """The cached tiled trace (in its own directory, which is what HTA's TraceAnalysis reads)."""
    tag = "" if source == SOURCE_NAME else "_" + source.split(".")[0]
    out = CACHE / f"big_{int(target_mb)}mb{tag}" / "rank0.json"
    if not out.exists():
        t = time.perf_counter()
        copies, n = make_big_trace(source_trace(source), out, target_bytes=int(target_mb * 1e6))
        print(f"made {out} ({copies} copies of {source}, {n / 1e6:.0f} MB) in {time.perf_counter() - t:.0f} s")
    return out


def hta_python() -> tuple[Path | None, str]:
    """(python of the HTA venv, '') or (None, why not). Installs once; never pulls torch/CUDA."""
    py = HTA_VENV / "bin" / "python"
    probe = [str(py), "-c", "import hta.trace_analysis"]
    if py.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return py, ""
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(HTA_VENV)], check=True, capture_output=True)
        report = CACHE / "hta-dry-run.json"
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--dry-run", "--report", str(report), *HTA_PINS],
                       check=True, capture_output=True, timeout=300)
        names = {i["metadata"]["name"].lower() for i in json.loads(report.read_text())["install"]}
        heavy = sorted(n for n in names if n.startswith(("torch", "nvidia", "triton")))
        if heavy:
            return None, f"HTA's dependencies would pull {', '.join(heavy)}"
        subprocess.run([str(py), "-m", "pip", "install", "-q", *HTA_PINS], check=True, capture_output=True,
                       timeout=600)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", HTA_PKG], check=True,
                       capture_output=True, timeout=300)  # no-deps: skips jupyterlab, which the parser never imports
        subprocess.run(probe, check=True, capture_output=True)
        return py, ""
    except (subprocess.SubprocessError, OSError, ValueError, KeyError) as exc:
        return None, f"could not build the HTA venv ({type(exc).__name__}: {str(exc)[:200]})"


def run_variant(python: Path, variant: str, path: Path, timeout_s: float) -> dict | None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        proc = subprocess.run([str(python), "-c", WORKER, variant, str(path)], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"  {variant}: timed out after {timeout_s:.0f} s")
        return None
    if proc.returncode != 0:
        print(f"  {variant}: failed: {proc.stderr.strip().splitlines()[-1:] or proc.returncode}")
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target-mb", type=float, default=500.0)
    ap.add_argument("--rounds", type=int, default=3, help="rounds for fusionlens, json.loads, orjson.loads")
    ap.add_argument("--slow-rounds", type=int, default=1, help="rounds for the slow variants")
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--one-gb", action="store_true", help="also time fusionlens once on a ~1 GB trace")
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--source", default=SOURCE_NAME, help="the real trace (tests/data/traces) to tile")
    ap.add_argument("--float-ts", action="store_true", help="also time fusionlens.float_ts (see above)")
    a = ap.parse_args(argv)

    path = big_trace(a.target_mb, a.source)
    size_mb = path.stat().st_size / 1e6
    print(f"trace: {path} ({size_mb:.0f} MB)\nmachine: {machine()}")
    fast = ["fusionlens", *(["fusionlens.float_ts"] if a.float_ts else []), "json.loads", "orjson.loads"]
    slow = ["json.loads+DataFrame", "duckdb.read_json"]
    pythons = {v: Path(sys.executable) for v in fast + slow}
    if not a.no_hta:
        py, why = hta_python()
        if py is None:
            print(f"skipping hta.TraceAnalysis: {why}")
        else:
            slow.append("hta.TraceAnalysis")
            pythons["hta.TraceAnalysis"] = py
    results: dict[str, list[dict]] = {v: [] for v in fast + slow}
    for r in range(max(a.rounds, a.slow_rounds)):
        order = (fast if r < a.rounds else ["fusionlens"]) + (slow if r < a.slow_rounds else [])
        for v in order:
            res = run_variant(pythons[v], v, path, a.timeout_s)
            if res:
                results[v].append(res)
                print(f"  round {r + 1}: {v:22s} wall {res['wall_s']:7.2f} s  cpu {res['cpu_s']:7.2f} s  "
                      f"peak RSS {res['rss_peak_mb']:7.0f} MB  rows {res['rows']:,}")
    report(results, size_mb, path, a)
    if a.one_gb:
        one_gb(a)
    return 0


def _ratio(results: dict, base: str, other: str, key: str) -> tuple[float, float, float]:
    """Per-round other/base (time of `other` per time of fusionlens), pairing runs of the same round."""
    pairs = zip(results[base], results[other])
    return percentiles(o[key] / b[key] for b, o in pairs if b[key] > 0)


def report(results: dict, size_mb: float, path: Path, a: argparse.Namespace) -> None:
    table, rows = [], []
    shape = f"{size_mb:.0f}MB_json"
    notes = f"src={a.source}; fresh subprocess per run; load1={os.getloadavg()[0]:.2f}"
    for v, runs in results.items():
        if not runs:
            continue
        wall = percentiles(x["wall_s"] for x in runs)
        cpu = percentiles(x["cpu_s"] for x in runs)
        rss = percentiles(x["rss_peak_mb"] for x in runs)
        mbps = percentiles(size_mb / x["wall_s"] for x in runs)
        mbps_cpu = percentiles(size_mb / x["cpu_s"] for x in runs)
        vs_json = _ratio(results, "fusionlens", v, "cpu_s") if v != "fusionlens" else (1.0,) * 3
        table.append([v, len(runs), wall[1], cpu[1], mbps[1], size_mb / cpu[1], rss[1], rss[1] / size_mb,
                      vs_json[1] if v != "fusionlens" else "-"])
        for metric, (p20, p50, p80), unit in (("wall_time", wall, "s"), ("cpu_time", cpu, "s"),
                                              ("throughput", mbps, "MB/s"), ("throughput_cpu", mbps_cpu, "MB/s"),
                                              ("peak_rss", rss, "MB")):
            rows.append(dict(benchmark="ingest", variant=v, shape=shape, metric=metric, p20=p20, p50=p50,
                             p80=p80, unit=unit, notes=f"{notes}; n={len(runs)}"))
        rows.append(dict(benchmark="ingest", variant=v, shape=shape, metric="peak_rss_per_input_size",
                         p20=rss[0] / size_mb, p50=rss[1] / size_mb, p80=rss[2] / size_mb, unit="x",
                         notes=notes))
        if v != "fusionlens":
            for key in ("cpu_s", "wall_s"):
                p20, p50, p80 = _ratio(results, "fusionlens", v, key)
                rows.append(dict(benchmark="ingest", variant=v, shape=shape, metric=f"{key[:-2]}_vs_fusionlens",
                                 p20=p20, p50=p50, p80=p80, unit="x", notes=f"{notes}; >1: fusionlens faster"))
    print_table(f"Ingestion of {path.name} ({size_mb:.0f} MB uncompressed); medians",
                ["variant", "runs", "wall s", "cpu s", "MB/s wall", "MB/s cpu", "peak RSS MB", "RSS/size",
                 "cpu x fusionlens"],
                table)
    if results["fusionlens"] and results["json.loads"]:
        fl, js = _ratio(results, "json.loads", "fusionlens", "cpu_s"), _ratio(results, "json.loads", "fusionlens", "wall_s")
        print(f"\nfusionlens time / json.loads time: cpu {fl[1]:.2f} (p20 {fl[0]:.2f}, p80 {fl[2]:.2f}), "
              f"wall {js[1]:.2f}  (target <= 0.5)")
        peak = percentiles(x["rss_peak_mb"] for x in results["fusionlens"])[1]
        print(f"fusionlens peak RSS / input size: {peak / size_mb:.2f}  (target <= 1.5)")
    out = append_rows("ingest.csv", rows)
    print(f"appended {len(rows)} rows to {out}")


def one_gb(a: argparse.Namespace) -> None:
    path = big_trace(1000.0)
    size_mb = path.stat().st_size / 1e6
    res = run_variant(Path(sys.executable), "fusionlens", path, a.timeout_s)
    if not res:
        return
    print(f"\n1 GB check: {size_mb:.0f} MB in wall {res['wall_s']:.2f} s, cpu {res['cpu_s']:.2f} s, "
          f"peak RSS {res['rss_peak_mb']:.0f} MB  (target < 10 s)")
    append_rows("ingest.csv", [dict(benchmark="ingest", variant="fusionlens", shape=f"{size_mb:.0f}MB_json",
                                    metric=m, p20=res[k], p50=res[k], p80=res[k], unit=u,
                                    notes=f"single run; load1={os.getloadavg()[0]:.2f}")
                               for m, k, u in (("wall_time", "wall_s", "s"), ("cpu_time", "cpu_s", "s"),
                                               ("peak_rss", "rss_peak_mb", "MB"))])


if __name__ == "__main__":
    sys.exit(main())
