#!/usr/bin/env python3
"""What kernel-name demangling adds to trace ingestion (profiler/trace/demangle.py).

- `load_trace` with and without the demangling pass (the pass swapped for the identity), interleaved
  in rounds, on the largest bundled NVIDIA trace (no `_Z` names: the pass is one vectorised
  `startswith` over the name categories) and the bundled ROCm trace (mangled ck_tile kernels);
- the pass alone (`demangle_kernel_names(events)`) on the same events, and with `--big` on the
  ~500 MB tiled trace `bench_ingest.py` uses (loaded once; cached under benchmarks/.cache);
- the cold cost of demangling the ROCm trace's unique names (memo cleared each round): libstdc++
  in-process, or c++filt for the DF16b names an older libstdc++ misreads (`demangle_status()`).

    .venv/bin/python benchmarks/bench_demangle.py [--rounds 7] [--big]

Rows go to benchmarks/results/demangle.csv.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # first, even when PYTHONPATH has it: benchmarks/kernels/ must not shadow kernels

from benchmarks.harness import append_rows, interleave, machine, percentiles, print_table, timing_rows  # noqa: E402

TRACES = ROOT / "tests" / "data" / "traces"
NVIDIA = TRACES / "hta_v100_rank1of2_trace_diff_test.json.gz"
ROCM = TRACES / "tracelens_amd_vllm_decode_hipgraph_replay.json.gz"
BIG = ROOT / "benchmarks" / ".cache" / "big_500mb" / "rank0.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--big", action="store_true", help=f"also time the pass alone on {BIG.name} (~500 MB)")
    args = ap.parse_args()

    from profiler.trace import demangle as dm
    from profiler.trace import ingest, load_trace

    real = ingest.demangle_kernel_names

    def without(path: Path):
        def run():
            ingest.demangle_kernel_names = lambda events: (events, {})
            try:
                return load_trace(path, workers=None if path == BIG else 1)
            finally:
                ingest.demangle_kernel_names = real
        return run

    print(machine())
    print("demangle_status():", dm.demangle_status())
    rows, table = [], []
    for path in (NVIDIA, ROCM):
        shape = path.name
        t = interleave({"load_trace": lambda p=path: load_trace(p, workers=1),
                        "load_trace_no_demangle": without(path)}, rounds=args.rounds)
        ratio = t.ratio("load_trace_no_demangle", "load_trace")
        rows += timing_rows("demangle_ingest", shape, t)
        rows.append(dict(benchmark="demangle_ingest", variant="no_demangle/with", shape=shape, metric="wall_ratio",
                         p20=ratio[0], p50=ratio[1], p80=ratio[2], unit="x", notes="<1: demangling costs"))
        events = without(path)().events  # names as written: the pass has its work to do
        alone = interleave({"demangle_kernel_names": lambda e=events: real(e)}, rounds=args.rounds, inner=20)
        rows += timing_rows("demangle_pass", shape, alone, unit_scale=1e6, unit="us",
                            notes=f"{len(events)} events, {len(events['name'].cat.categories)} names")
        for name, xs in (("load_trace", t.wall_s["load_trace"]), ("no_demangle", t.wall_s["load_trace_no_demangle"]),
                         ("pass alone", alone.wall_s["demangle_kernel_names"])):
            p20, p50, p80 = percentiles(x * 1e3 for x in xs)
            table.append([shape[:40], name, p20, p50, p80])
        table.append([shape[:40], "ratio no/with", *ratio])

    mangled = sorted({n for n in load_trace(ROCM, workers=1).meta["demangled_names"].values()})

    def cold():
        dm.cache_clear()
        return dm.demangle_many(mangled)

    c = interleave({"cold_unique_names": cold}, rounds=args.rounds)
    rows += timing_rows("demangle_cold", f"{ROCM.name}:{len(mangled)} names", c, notes=str(dm.demangle_status()))
    table.append([f"{len(mangled)} ROCm names, cold", "demangle_many", *percentiles(x * 1e3 for x in c.wall_s["cold_unique_names"])])

    if args.big:
        if not BIG.exists():
            print(f"--big: {BIG} missing (make it with benchmarks/bench_ingest.py)")
        else:
            events = without(BIG)().events
            alone = interleave({"demangle_kernel_names": lambda: real(events)}, rounds=5, inner=5)
            rows += timing_rows("demangle_pass", BIG.parent.name, alone, unit_scale=1e6, unit="us",
                                notes=f"{len(events)} events, {len(events['name'].cat.categories)} names")
            table.append([BIG.parent.name, "pass alone", *percentiles(x * 1e3 for x in alone.wall_s["demangle_kernel_names"])])
            del events
    print_table("wall ms (ratio: x)", ["trace", "variant", "p20", "p50", "p80"], table)
    print("->", append_rows("demangle.csv", rows))


if __name__ == "__main__":
    main()
