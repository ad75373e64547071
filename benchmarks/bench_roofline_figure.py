"""Roofline figure: `profiler.present.roofline.roofline_figure` against the plotly.express scatter a
user would write for the same points (log-log, size = time, colour = bound), build + to_json (what
`st.plotly_chart` sends), interleaved in rounds.

    .venv/bin/python benchmarks/bench_roofline_figure.py [--points 50000] [--rounds 7] [--csv roofline_figure.csv]

Cases: N synthetic per-op points (a large trace's per-op view) and a real capture's per-op-type
table and per-op points (gpt2-naive small, train, 3 steps, CPU). Rows (benchmark
"roofline_figure", variants ours / plotly_express, and the speedup) go to benchmarks/results/<csv>.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # first, even when PYTHONPATH has it: benchmarks/kernels/ must not shadow kernels

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import plotly.express as px  # noqa: E402
import torch  # noqa: E402

from benchmarks.harness import append_rows, interleave, print_table, timing_rows  # noqa: E402
from profiler.analysis.roofline import roofline  # noqa: E402
from profiler.capture.backends import CapturePlan  # noqa: E402
from profiler.capture.devices import Ceilings  # noqa: E402
from profiler.capture.runner import capture  # noqa: E402
from profiler.present.roofline import roofline_figure  # noqa: E402

CEILINGS = Ceilings({"fp32": 176e9}, 41e9, "measured")  # this VM's order of magnitude (1 core)


def synthetic_points(n: int, seed: int = 0) -> pd.DataFrame:
    """n per-op points spread over 6 decades of intensity, under the roofs of CEILINGS."""
    rng = np.random.default_rng(seed)
    x = 10 ** rng.uniform(-3, 3, n)
    peak, bw = CEILINGS.peak_for("fp32"), CEILINGS.mem_bw_bytes_per_s
    return pd.DataFrame({
        "kind": "cpu_op", "dtype": "fp32", "name": pd.Categorical([f"aten::op{i % 300}" for i in range(n)]),
        "dur_us": rng.uniform(1, 1000, n), "algorithmic_intensity_flop_per_byte": x,
        "achieved_flops_per_s": np.minimum(peak, bw * x) * rng.uniform(0.001, 1, n),
        "bound": np.where(x < peak / bw, "memory", "compute"), "pct_of_roof": 50.0, "headroom_us": 1.0})


def express(rows: pd.DataFrame, time_col: str) -> str:
    """The plain plotly.express figure of the same points, as JSON."""
    fig = px.scatter(rows, x="algorithmic_intensity_flop_per_byte", y="achieved_flops_per_s", size=time_col,
                     color="bound", hover_name="name", log_x=True, log_y=True)
    return fig.to_json()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--csv", default="roofline_figure.csv")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    res = capture("gpt2-naive", CapturePlan(mode="train", wait=0, warmup=1, active=3), tempfile.mkdtemp(), size="small")
    rr = roofline(res.trace, CEILINGS)
    pts = synthetic_points(args.points)
    by_type = rr.by_op_type
    time_col = "dur_us" if "dur_us" in by_type else next(c for c in by_type.columns if c.endswith("_us"))
    cases = {
        f"{args.points} synthetic op points": (pts, "ops", "dur_us"),
        f"gpt2-naive small train, {len(by_type)} op types": (by_type, "op types", time_col),
        f"gpt2-naive small train, {len(rr.points)} op points": (rr.points, "ops", "dur_us"),
    }
    rows, table = [], []
    for shape, (data, what, tcol) in cases.items():
        finite = data[(data["algorithmic_intensity_flop_per_byte"] > 0) & (data["achieved_flops_per_s"] > 0)]
        timing = interleave({"ours": lambda d=data, w=what: roofline_figure(d, CEILINGS, what=w).to_json(),
                             "plotly_express": lambda d=finite, t=tcol: express(d, t)}, rounds=args.rounds)
        rows += timing_rows("roofline_figure", shape, timing, notes="build + to_json")
        p20, p50, p80 = timing.ratio("plotly_express", "ours")
        rows.append(dict(benchmark="roofline_figure", variant="ours_vs_plotly_express", shape=shape,
                         metric="speedup_wall", p20=p20, p50=p50, p80=p80, unit="x", notes="per-round ratio"))
        med = {k: float(np.median(v)) * 1e3 for k, v in timing.wall_s.items()}
        table.append([shape, f"{med['ours']:.1f}", f"{med['plotly_express']:.1f}", f"{p50:.2f}x ({p20:.2f}-{p80:.2f})"])
    print_table("roofline figure, build + to_json (ms, wall p50)", ["case", "ours", "plotly.express", "speedup"], table)
    print(f"rows appended to {append_rows(args.csv, rows)}")


if __name__ == "__main__":
    main()
