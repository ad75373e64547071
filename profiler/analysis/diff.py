"""Diff of two traces: per kernel name and per op, counts and times in A and B and their change.

A is the baseline (`trace`), B the candidate (`other`). Kernel rows come from `kernel_breakdown`
(every GPU activity: kernels, memcpy, memset; summed over ranks); op rows from the attribution's
op table (calls, device time launched by the op and its children, CPU time). Rows are sorted by
|Δ time|; a name only in B is `new`, only in A `vanished`. `delta_pct` is relative to A and
NaN (null in JSON) for new names. Totals add the median ProfilerStep time of each (None without
step markers) and its change in %.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from profiler.analysis.registry import register_analysis

STATUS_BOTH, STATUS_NEW, STATUS_VANISHED = "both", "new", "vanished"


@dataclass(frozen=True)
class TraceDiff:
    """kernels / ops: one row per name (see module doc); totals: whole-trace sums in A and B."""

    kernels: pd.DataFrame
    ops: pd.DataFrame
    totals: dict

    def __post_init__(self) -> None:
        for name in ("kernels", "ops"):
            frame = getattr(self, name)
            if not isinstance(frame, pd.DataFrame) or "delta_us" not in frame:
                raise TypeError(f"TraceDiff.{name} must be a DataFrame with delta_us")

    @property
    def new(self) -> list[str]:
        return self.kernels.loc[self.kernels["status"] == STATUS_NEW, "name"].tolist()

    @property
    def vanished(self) -> list[str]:
        return self.kernels.loc[self.kernels["status"] == STATUS_VANISHED, "name"].tolist()


def diff_tables(a: pd.DataFrame, b: pd.DataFrame, count: str, total: str, extra: tuple[str, ...] = ()) -> pd.DataFrame:
    """Outer-join two per-name tables on `name` and compute the deltas of `count` and `total`."""
    cols = ["name", count, total, *extra]
    a = a[cols].assign(name=a["name"].astype(str)).groupby("name", sort=False).sum().reset_index()
    b = b[cols].assign(name=b["name"].astype(str)).groupby("name", sort=False).sum().reset_index()
    m = a.merge(b, on="name", how="outer", suffixes=("_a", "_b"), indicator=True)
    status = m["_merge"].map({"both": STATUS_BOTH, "left_only": STATUS_VANISHED, "right_only": STATUS_NEW})
    out = pd.DataFrame({"name": m["name"], "status": status.astype(str)})
    for c in (count, *extra, total):
        out[f"{c}_a"] = m[f"{c}_a"].fillna(0)
        out[f"{c}_b"] = m[f"{c}_b"].fillna(0)
    out = out.rename(columns={f"{count}_a": "count_a", f"{count}_b": "count_b",
                              f"{total}_a": "total_us_a", f"{total}_b": "total_us_b"})
    out["count_a"] = out["count_a"].astype("int64")
    out["count_b"] = out["count_b"].astype("int64")
    out["delta_count"] = out["count_b"] - out["count_a"]
    out["delta_us"] = out["total_us_b"] - out["total_us_a"]
    with np.errstate(divide="ignore", invalid="ignore"):
        out["delta_pct"] = np.where(out["total_us_a"] > 0, 100.0 * out["delta_us"] / out["total_us_a"], np.nan)
    order = np.argsort(-out["delta_us"].abs().to_numpy(), kind="stable")
    return out.iloc[order].reset_index(drop=True)


@register_analysis("diff", "Diff of two traces",
                   "Per kernel name and per op: count and time in A and B, Δ, Δ%, new and vanished names")
def diff(trace, other) -> TraceDiff:
    """Compare `trace` (A, baseline) with `other` (B)."""
    from profiler.analysis.attribution import attribution
    from profiler.analysis.kernels import kernel_breakdown

    ka, kb = kernel_breakdown(trace), kernel_breakdown(other)
    kernels = diff_tables(ka, kb, "count", "total_us")
    oa, ob = attribution(trace).ops, attribution(other).ops
    ops = diff_tables(oa, ob, "calls", "device_total_us", extra=("cpu_total_us",))
    ops = ops.rename(columns={"cpu_total_us_a": "cpu_us_a", "cpu_total_us_b": "cpu_us_b"})
    ops["delta_cpu_us"] = ops["cpu_us_b"] - ops["cpu_us_a"]
    totals = {"kernel_us_a": float(ka["total_us"].sum()), "kernel_us_b": float(kb["total_us"].sum()),
              "kernel_count_a": int(ka["count"].sum()), "kernel_count_b": int(kb["count"].sum())}
    totals["delta_kernel_us"] = totals["kernel_us_b"] - totals["kernel_us_a"]
    totals["step_us_a"], totals["step_us_b"] = median_step_us(trace), median_step_us(other)
    both = totals["step_us_a"] is not None and totals["step_us_b"] is not None
    totals["delta_step_pct"] = (100.0 * (totals["step_us_b"] - totals["step_us_a"]) / totals["step_us_a"]
                                if both and totals["step_us_a"] > 0 else None)
    return TraceDiff(kernels=kernels, ops=ops, totals=totals)


def median_step_us(trace) -> float | None:
    """Median duration of the trace's ProfilerStep windows (all ranks), None without step markers:
    the number a before/after comparison of one model is about."""
    from profiler.analysis.breakdown import step_windows

    windows = step_windows(trace)
    windows = windows[windows["step"].notna()]
    return float(windows["duration_us"].median()) if len(windows) else None
