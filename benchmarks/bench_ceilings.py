"""How long measuring the roofline ceilings takes here, and what it measures (issue 4: under 30 s).

Each round runs `measured_ceilings(device, mode, refresh=True)` in a fresh process (a cold cache and
a cold allocator, as a user's first capture sees it) and records the wall time and the figures.
Rows go to benchmarks/results/ceilings.csv (harness columns); threads and load average are in
`machine`, and the per-thread-count figures in `notes`.
Usage: .venv/bin/python benchmarks/bench_ceilings.py [--mode full|quick] [--rounds 3] [--device cpu]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.harness import append_rows, percentiles, print_table  # noqa: E402

CHILD = """
import json, sys
from profiler.capture.ceilings import measured_ceilings
c = measured_ceilings(sys.argv[1], sys.argv[2], refresh=True, root=sys.argv[3])
print(json.dumps(c.to_json()))
"""


def per_thread_note(per_threads: dict) -> str:
    """'1t: fp32 30.0 fp64 13.6 GFLOP/s, bw 12.1 GB/s; 2t: ...' from the last round."""
    parts = []
    for threads, fig in per_threads.items():
        flops = " ".join(f"{d} {v / 1e9:.1f}" for d, v in fig["peak_flops_per_s"].items())
        parts.append(f"{threads}t: {flops} GFLOP/s, bw {max(fig['mem_bw_bytes_per_s'].values()) / 1e9:.1f} GB/s")
    return "; ".join(parts) or "single thread count"


def one_round(device: str, mode: str) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as root:
        t0 = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", CHILD, device, mode, root], capture_output=True, text=True,
                             cwd=ROOT, check=True)
        return time.perf_counter() - t0, json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="full", choices=("full", "quick"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    walls, measure_s, figures = [], [], {}
    for _ in range(args.rounds):
        wall, ceil = one_round(args.device, args.mode)
        walls.append(wall)
        measure_s.append(ceil["details"]["measure_s"])
        for dtype, v in ceil["peak_flops_per_s"].items():
            figures.setdefault(f"peak_{dtype}", []).append(v / 1e9)
        figures.setdefault("mem_bw", []).append(ceil["mem_bw_bytes_per_s"] / 1e9)
        last = ceil
    shape = f"{args.device} {args.mode}"
    rows = [{"benchmark": "ceilings", "variant": "measured_ceilings", "shape": shape, "metric": "wall_s",
             "unit": "s", "notes": "fresh process, cold cache (includes torch import)"},
            {"benchmark": "ceilings", "variant": "measured_ceilings", "shape": shape, "metric": "measure_s",
             "unit": "s", "notes": "measurement only"}]
    for row, xs in zip(rows, (walls, measure_s)):
        row.update(zip(("p20", "p50", "p80"), percentiles(xs)))
    for name, xs in figures.items():
        unit = "GB/s" if name == "mem_bw" else "GFLOP/s"
        rows.append({"benchmark": "ceilings", "variant": "measured_ceilings", "shape": shape, "metric": name,
                     "unit": unit, "notes": per_thread_note(last["details"].get("per_threads", {})),
                     **dict(zip(("p20", "p50", "p80"), percentiles(xs)))})
    path = append_rows("ceilings.csv", rows)
    print_table(f"ceilings ({shape}, {args.rounds} rounds) -> {path}", ["metric", "p20", "p50", "p80", "unit"],
                [[r["metric"], f"{r['p20']:.3g}", f"{r['p50']:.3g}", f"{r['p80']:.3g}", r["unit"]] for r in rows])


if __name__ == "__main__":
    main()
