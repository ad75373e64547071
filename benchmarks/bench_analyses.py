#!/usr/bin/env python3
"""Time ingestion and every registered analysis on the ~500 MB benchmark trace (issue 3, Speed).

The trace is a real one (default: the V100 rank-1 training trace with NCCL, CUDA graphs and
copies) tiled in time by `benchmarks/make_big_trace.py` into `benchmarks/.cache/`. Ingestion
(`load_trace`) and each analysis run interleaved, round by round (harness protocol); `rules` is
timed on precomputed results (the rule logic alone). The claim checked, per round: the sum of all
analyses' wall time is below that round's ingestion time. Rows go to
`benchmarks/results/analyses.csv`.

    .venv/bin/python benchmarks/bench_analyses.py [--rounds 3] [--target-mb 500] [--trace PATH]
"""
from __future__ import annotations

import argparse
import gc
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # first, even when PYTHONPATH has it: benchmarks/kernels/ must not shadow kernels

from benchmarks.harness import append_rows, interleave, percentiles, print_table, timing_rows  # noqa: E402

DEFAULT_SRC = ROOT / "tests" / "data" / "traces" / "hta_v100_rank1of2_trace_diff_test.json.gz"
CACHE = ROOT / "benchmarks" / ".cache"


def bench_trace(src: Path, target_mb: float) -> Path:
    """The tiled trace, built once per (source, size) and cached."""
    from benchmarks.make_big_trace import make_big_trace

    out = CACHE / f"analyses_{src.name.split('.')[0]}_{int(target_mb)}mb.json"
    if not out.exists():
        t = time.perf_counter()
        copies, size = make_big_trace(src, out, target_bytes=int(target_mb * 1e6))
        print(f"built {out.name}: {copies} copies, {size / 1e6:.0f} MB in {time.perf_counter() - t:.1f} s")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, help="use this trace instead of building the tiled one")
    ap.add_argument("--src", type=Path, default=DEFAULT_SRC)
    ap.add_argument("--target-mb", type=float, default=500.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-csv", action="store_true", help="do not append to benchmarks/results/analyses.csv")
    a = ap.parse_args(argv)

    from profiler.analysis import load_all
    from profiler.analysis.findings import Results
    from profiler.analysis.registry import ANALYSES
    from profiler.analysis.report_json import _needs_only_trace
    from profiler.analysis.rules import run_rules
    from profiler.trace import load_trace

    path = a.trace or bench_trace(a.src, a.target_mb)
    load_all()
    trace = load_trace(str(path))
    n_ranks = trace.events["rank"].nunique()
    names = [n for n, s in sorted(ANALYSES.items())
             if _needs_only_trace(s.fn) and n_ranks >= s.needs_ranks]
    skipped = sorted(set(ANALYSES) - set(names))
    warm = Results(trace)
    for n in names:
        warm[n]  # precomputed results for timing the rules alone

    def ingest() -> None:
        gc.collect()
        load_trace(str(path))

    variants = {"ingest": ingest}
    variants.update({n: (lambda n=n: ANALYSES[n](trace)) for n in names})
    variants["rules"] = lambda: run_rules(trace, Results(trace, precomputed=dict(warm._cache)))
    timing = interleave(variants, rounds=a.rounds, warmup=0)

    mb = path.stat().st_size / 1e6
    shape = f"{mb:.0f}MB,{len(trace.events)}ev"
    analyses = [n for n in variants if n != "ingest"]
    per_round = [sum(timing.wall_s[n][i] for n in analyses) for i in range(a.rounds)]
    ratio = [s / timing.wall_s["ingest"][i] for i, s in enumerate(per_round)]
    rows = []
    for n in variants:
        p20, p50, p80 = percentiles(x * 1e3 for x in timing.wall_s[n])
        c50 = percentiles(x * 1e3 for x in timing.cpu_s[n])[1]
        rows.append([n, p50, p20, p80, c50])
    s20, s50, s80 = percentiles(x * 1e3 for x in per_round)
    rows.append(["ALL ANALYSES + rules", s50, s20, s80, float("nan")])
    print_table(f"analyses on {path.name} ({shape}; {a.rounds} interleaved rounds; wall ms)",
                ["variant", "p50", "p20", "p80", "cpu p50"], rows)
    r20, r50, r80 = percentiles(ratio)
    verdict = "yes" if max(ratio) < 1 else "no"
    print(f"\nall analyses / ingestion, per round: p50 {r50:.2f} (p20 {r20:.2f}, p80 {r80:.2f}); "
          f"all analyses faster than ingestion in every round: {verdict}")
    print(f"skipped (need parameters or ranks): {', '.join(skipped) or 'none'}; "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3:,.0f} MB")
    if not a.no_csv:
        out = timing_rows("analyses", shape, timing, notes=f"src={path.name}")
        out.append(dict(benchmark="analyses", variant="all_analyses_over_ingest", shape=shape,
                        metric="wall_ratio", p20=r20, p50=r50, p80=r80, unit="x",
                        notes=f"sum of {len(analyses)} analyses+rules / ingestion, per round"))
        print(f"appended {len(out)} rows to {append_rows('analyses.csv', out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
