"""One run of `bench_kernels.py` as a markdown table, straight from `results/kernels.csv`.

The README's kernel table is this script's output for one run (one window of dates), so every
row in it comes from the same machine, hour and protocol. Per case (kernel, shape label) and
thread count: ours' p50 (p20-p80) in ms, then the per-round ratios other / ours (> 1: ours
faster) against each baseline the case timed, and ours' bytes moved per second (the case's
algorithmic bytes over ours' p50 wall time). The run's memory ceilings (copy, and triad since
2026-12-03) are printed above the table. At 1 thread times and ratios are CPU time (what the
README quotes; less sensitive to the shared machine's steal); above it, wall time.

    .venv/bin/python benchmarks/kernels_table.py --since 2026-12-03T17:19 [--until ...] [--threads 1]
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from benchmarks.harness import read_results  # noqa: E402

CSV = Path(__file__).resolve().parent / "results" / "kernels.csv"
# baselines in the order the table shows them: (variant name in the CSV, column title)
BASELINES = (("naive", "vs naive"), ("foreach", "vs foreach"), ("aten", "vs ATen"),
             ("compile", "vs torch.compile"))
THREADS = re.compile(r"torch_threads=(\d+)")


def load(path: Path = CSV) -> pd.DataFrame:
    """kernels.csv and its archive (older rows, harness.rotate) with a `threads` column parsed
    from the machine field."""
    df = read_results(path)
    df["threads"] = df["machine"].str.extract(THREADS, expand=False).astype("Int64")
    return df


def select(df: pd.DataFrame, since: str, until: str | None = None) -> pd.DataFrame:
    """Rows dated in [since, until) (ISO strings compare as dates)."""
    keep = df["date"] >= since
    if until:
        keep &= df["date"] < until
    return df[keep]


def _fmt(x: float) -> str:
    return f"{x:.3g}" if x == x else "-"


def summarize(df: pd.DataFrame, threads: int = 1) -> pd.DataFrame:
    """One row per (kernel, shape) at `threads`, in the run's order; the last measurement wins
    where a case was timed twice in the window."""
    time_metric, ratio_metric = ("cpu_time", "speedup_cpu") if threads == 1 else ("wall_time", "speedup_wall")
    run = df[df["threads"] == threads]
    ceilings = run[(run["benchmark"] == "copy") & (run["metric"] == "bandwidth")]
    ceilings = ceilings[ceilings["date"] == ceilings["date"].max()]  # the run's last measurement
    cases = run[(run["benchmark"] != "copy") & (run["variant"] == "ours") & (run["metric"] == time_metric)]
    rows = []
    for (kernel, shape), _ in cases.groupby(["benchmark", "shape"], sort=False):
        case = run[(run["benchmark"] == kernel) & (run["shape"] == shape)]

        def last(variant: str, metric: str) -> pd.Series | None:
            hit = case[(case["variant"] == variant) & (case["metric"] == metric)]
            return hit.iloc[-1] if len(hit) else None

        ours = last("ours", time_metric)
        bw = last("ours", "bandwidth")
        row = {"kernel": kernel, "shape": shape,
               "ours ms p50 (p20-p80)": f"{_fmt(ours['p50'])} ({_fmt(ours['p20'])}-{_fmt(ours['p80'])})"}
        for variant, title in BASELINES:
            ratio = last(f"ours_vs_{variant}", ratio_metric)
            row[title] = _fmt(float(ratio["p50"])) if ratio is not None else "-"
        row["ours GB/s"] = _fmt(float(bw["p50"])) if bw is not None else "-"
        rows.append(row)
    out = pd.DataFrame(rows)
    out.attrs["ceilings"] = dict(zip(ceilings["variant"], ceilings["p50"].astype(float)))
    return out


def to_markdown(table: pd.DataFrame) -> str:
    """A GitHub markdown table (no tabulate dependency)."""
    cols = list(table.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--since", required=True, help="first date of the run (ISO, e.g. 2026-12-03T17:19)")
    ap.add_argument("--until", help="end of the window (exclusive)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--csv", type=Path, default=CSV)
    args = ap.parse_args(argv)
    try:
        rows = select(load(args.csv), args.since, args.until)
    except (OSError, KeyError, ValueError) as exc:
        print(f"kernels_table: cannot read {args.csv}: {exc}", file=sys.stderr)
        return 2
    table = summarize(rows, args.threads)
    if table.empty:
        print(f"kernels_table: no rows at {args.threads} thread(s) in that window", file=sys.stderr)
        return 1
    ceilings = ", ".join(f"{name} {v:.3g}" for name, v in table.attrs["ceilings"].items()) or "not measured"
    print(f"memory bandwidth at {args.threads} thread(s), GB/s: {ceilings}")
    print(to_markdown(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
