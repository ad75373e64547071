"""Kernel breakdowns: per kernel name, per launch configuration, per kernel type with overlaps.

All GPU activity counts as a "kernel" here, as in HTA's kernel breakdown: kernels plus
`gpu_memcpy` / `gpu_memset` rows (type `memory`). `total_us` is the sum of durations (a kernel's
own time); `share` is its fraction of the summed GPU time of its scope (all ranks, or its rank
with `by_rank=True`). `std_us` is the population standard deviation (ddof=0), so a kernel seen
once has std 0 rather than NaN. Types come from `kernel_types` (communication recognised by
content, not only by an `nccl` prefix).

`kernel_type_breakdown` adds what a sum of durations cannot show: `busy_us` (the union of each
type's intervals, overlaps within a type counted once) and the time two types run at once
(`computation&communication`, `computation&memory`, `communication&memory`): the overlap of
communication with computation is the time the collective is hidden.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Mapping

import numpy as np
import pandas as pd

from profiler.analysis import intervals as iv
from profiler.analysis import kernel_types as kt
from profiler.analysis.breakdown import gpu_activity
from profiler.analysis.registry import register_analysis

_STATS = dict(count=("dur_us", "size"), total_us=("dur_us", "sum"), mean_us=("dur_us", "mean"),
              min_us=("dur_us", "min"), max_us=("dur_us", "max"))


def _stats(g: pd.DataFrame, keys: list[str], by_rank: bool) -> pd.DataFrame:
    """Count/total/mean/min/max/std/share of `dur_us` per `keys` (+ rank), largest total first."""
    keys = (["rank"] + keys) if by_rank else keys
    grouped = g.groupby(keys, observed=True, sort=False, dropna=False)
    out = grouped.agg(**_STATS)
    out["std_us"] = grouped["dur_us"].std(ddof=0)  # population std, Welford in C
    out = out.reset_index()
    scope = out.groupby("rank")["total_us"].transform("sum") if by_rank else out["total_us"].sum()
    with np.errstate(invalid="ignore", divide="ignore"):
        out["share"] = np.where(scope > 0, out["total_us"] / scope, 0.0)
    out["count"] = out["count"].astype("int64")
    return out.sort_values((["rank"] if by_rank else []) + ["total_us"], ascending=([True] if by_rank else []) + [False],
                           kind="stable").reset_index(drop=True)


@register_analysis("kernel_breakdown", "Kernel breakdown",
                   "Per kernel name: type, count, total, mean, min, max, std and share of GPU time")
def kernel_breakdown(trace, by_rank: bool = False) -> pd.DataFrame:
    """Columns: `[rank,] name, kernel_type, count, total_us, mean_us, min_us, max_us, std_us, share`."""
    g = gpu_activity(trace)
    out = _stats(g, ["name"], by_rank)  # grouped on the categorical codes; names become str below
    out["name"] = out["name"].astype(object).astype(str)
    # A name has one type, except that collective args may mark only some of its calls: then the
    # name is communication (ranking communication > memory > computation).
    order = np.array([2, 0, 1])[g["kernel_type"].cat.codes.to_numpy()]  # KERNEL_TYPES -> rank
    best = pd.Series(order).groupby(g["name"].cat.codes.to_numpy()).min()
    by_code = pd.Series(np.array([kt.COMMUNICATION, kt.MEMORY, kt.COMPUTATION])[best.to_numpy()],
                        index=np.asarray(g["name"].cat.categories, dtype=object)[best.index.to_numpy()])
    out["kernel_type"] = pd.Categorical(out["name"].map(by_code), categories=list(kt.KERNEL_TYPES))
    cols = (["rank"] if by_rank else []) + ["name", "kernel_type", "count", "total_us", "mean_us",
                                             "min_us", "max_us", "std_us", "share"]
    return out[cols]


@register_analysis("kernel_launch_config_breakdown", "Kernels by launch configuration",
                   "Per kernel name + grid + block: count, total, mean, min, max, std and share")
def kernel_launch_config_breakdown(trace, by_rank: bool = False) -> pd.DataFrame:
    """Like `kernel_breakdown`, grouped by name and grid/block dims (kernels only)."""
    g = trace.kernels
    g = g.assign(kernel_type=kt.kernel_type(g))
    dims = ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]
    g = g.assign(**{d: g[d].astype("float64") for d in dims})  # NaN-safe group keys
    out = _stats(g, ["name", "kernel_type"] + dims, by_rank)
    out["name"] = out["name"].astype(object).astype(str)
    for d in dims:
        out[d] = out[d].astype("Int32")
    out["blocks"] = (out["grid_x"] * out["grid_y"] * out["grid_z"]).astype("Int64")
    out["threads_per_block"] = (out["block_x"] * out["block_y"] * out["block_z"]).astype("Int64")
    return out


@dataclass(frozen=True)
class KernelTypeBreakdown:
    """Time per kernel type and the overlaps between types.

    table: `rank, kernel_type, count, total_us, busy_us, share` (share of the rank's summed time).
    overlaps: `rank, types, overlap_us` (types like `computation&communication`).
    """

    table: pd.DataFrame
    overlaps: pd.DataFrame

    def __post_init__(self) -> None:
        need = {"rank", "kernel_type", "count", "total_us", "busy_us", "share"}
        if not need <= set(self.table.columns):
            raise ValueError(f"KernelTypeBreakdown.table lacks {sorted(need - set(self.table.columns))}")
        if not {"rank", "types", "overlap_us"} <= set(self.overlaps.columns):
            raise ValueError("KernelTypeBreakdown.overlaps needs rank, types, overlap_us")

    @property
    def total_us(self) -> Mapping[str, float]:
        """{kernel_type: summed duration µs over all ranks} (every type present, 0 when absent)."""
        s = self.table.groupby("kernel_type", observed=False)["total_us"].sum()
        return {t: float(s.get(t, 0.0)) for t in kt.KERNEL_TYPES}

    @property
    def overlap_us(self) -> Mapping[str, float]:
        """{"a&b": µs where both types run, summed over ranks}."""
        s = self.overlaps.groupby("types")["overlap_us"].sum()
        return {k: float(v) for k, v in s.items()}


@register_analysis("kernel_type_breakdown", "Kernel type breakdown",
                   "Computation, communication and memory time, and the overlap between them")
def kernel_type_breakdown(trace) -> KernelTypeBreakdown:
    """Per rank and type: count, summed time, busy (union) time, share; and pairwise overlaps."""
    g = gpu_activity(trace)
    ranks = sorted(set(trace.ranks) | set(g["rank"].unique().tolist()))
    idx = pd.MultiIndex.from_product([ranks, list(kt.KERNEL_TYPES)], names=["rank", "kernel_type"])
    agg = (g.groupby(["rank", "kernel_type"], observed=True).agg(count=("dur_us", "size"), total_us=("dur_us", "sum"))
           .reindex(idx, fill_value=0))
    rank = g["rank"].to_numpy(np.int64)
    ts, end = g["ts_us"].to_numpy(float), g["end_us"].to_numpy(float)
    tcode = g["kernel_type"].cat.codes.to_numpy()
    sel = {t: tcode == i for i, t in enumerate(kt.KERNEL_TYPES)}
    unions = {t: iv.union_by_group(rank[sel[t]], ts[sel[t]], end[sel[t]]) for t in kt.KERNEL_TYPES}
    busy = pd.concat({t: u.total_by_group() for t, u in unions.items()}, names=["kernel_type", "rank"])
    agg["busy_us"] = busy.swaplevel().reindex(idx, fill_value=0.0) if len(busy) else 0.0
    table = agg.reset_index()
    table["count"] = table["count"].astype("int64")
    table["total_us"] = table["total_us"].astype("float64")
    scope = table.groupby("rank")["total_us"].transform("sum")
    table["share"] = np.where(scope > 0, table["total_us"] / scope.where(scope > 0, 1.0), 0.0)
    rows = []
    for a, b in combinations(kt.KERNEL_TYPES, 2):  # 3 pairs x ranks, not per event
        for r in ranks:
            ua, ub = (_rank_union(unions[t], r) for t in (a, b))
            rows.append({"rank": r, "types": f"{a}&{b}", "overlap_us": iv.intersection_length(ua, ub)})
    overlaps = pd.DataFrame(rows, columns=["rank", "types", "overlap_us"])
    return KernelTypeBreakdown(table=table, overlaps=overlaps)


def _rank_union(u: iv.GroupedIntervals, rank: int) -> iv.Intervals:
    sel = u.groups == rank
    return iv.Intervals(u.starts[sel], u.ends[sel])
