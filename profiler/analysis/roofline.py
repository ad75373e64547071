"""Roofline: every op and kernel with known FLOPs and bytes placed against the machine's ceilings.

DESIGN.md, Roofline. A pure function of a Trace and `Ceilings` (measured, or the device table
picked from the trace's deviceProperties); it never measures. Per row:

- algorithmic intensity = flops / bytes_moved (FLOP/byte). The bytes are inputs + outputs of the
  op: an algorithmic lower bound on traffic, NOT measured DRAM traffic, hence "algorithmic";
- achieved FLOP/s and bytes/s = flops / dur, bytes / dur;
- bound = "memory" when the intensity is below the ridge point peak/bandwidth, else "compute";
- time at roof = max(flops / peak, bytes / bandwidth); % of roof = time at roof / dur; headroom =
  dur - time at roof (what a perfect kernel could save; negative when the op beat the algorithmic
  bound, e.g. data already in cache).

Rows without FLOPs/bytes (uploaded traces: NaN) are excluded and counted, as are rows with zero
duration or no work. The peak per row is the roof of its dtype: from its `input_types` (cpu_op) or
its launching op's (kernel, via External id), else `default_dtype`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Optional

import numpy as np
import pandas as pd

from profiler.analysis.registry import register_analysis
from profiler.capture.devices import Ceilings, ceilings_from_meta
from profiler.errors import FusionLensError

MODULE_PREFIX = "nn.Module: "
INTENSITY_NOTE = ("algorithmic intensity: bytes are inputs + outputs of each op (a lower bound), "
                  "not measured DRAM traffic")
# Kineto 'Input type' spellings -> roofline dtype. The first floating input decides.
TYPE_TO_DTYPE: Mapping[str, str] = MappingProxyType({
    "float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16", "double": "fp64",
    "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8",
    "float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
})
POINT_COLUMNS = ("event_index", "rank", "kind", "name", "module", "dtype", "ts_us", "dur_us", "flops", "bytes_moved",
                 "algorithmic_intensity_flop_per_byte", "achieved_flops_per_s", "achieved_bytes_per_s",
                 "peak_flops_per_s", "mem_bw_bytes_per_s", "ridge_flop_per_byte", "bound",
                 "time_at_roof_us", "pct_of_roof", "headroom_us", "external_id")


class RooflineError(FusionLensError):
    """The roofline cannot be computed as asked (e.g. a dtype the ceilings do not cover)."""


@dataclass(frozen=True)
class RooflineResult:
    """Points (one per op/kernel), aggregates per op type and per module, and what was left out."""

    points: pd.DataFrame
    by_op_type: pd.DataFrame
    by_module: Optional[pd.DataFrame]
    ceilings: Optional[Ceilings]
    excluded: Mapping[str, int] = field(default_factory=dict)
    reason: Optional[str] = None  # why there are no points at all, when there are none
    note: str = INTENSITY_NOTE

    def __post_init__(self) -> None:
        object.__setattr__(self, "excluded", MappingProxyType(dict(self.excluded)))


def _first_float_dtype(types_json: Any) -> Optional[str]:
    if not isinstance(types_json, str) or not types_json:
        return None
    try:
        types = json.loads(types_json)
    except ValueError:
        return None
    for t in types if isinstance(types, list) else ():
        if isinstance(t, str) and t in TYPE_TO_DTYPE:
            return TYPE_TO_DTYPE[t]
    return None


def _row_dtypes(events: pd.DataFrame, default_dtype: str) -> pd.Series:
    """dtype per row: own input_types, else the cpu_op with the same (rank, external_id), else default."""
    types = events["input_types"].astype(object)
    uniques = pd.unique(types)  # few distinct type lists: parse each once, then map
    own = types.map(dict(zip(uniques, (_first_float_dtype(t) for t in uniques))))
    ops = events[(events["kind"] == "cpu_op") & own.notna() & events["external_id"].notna()]
    keyed = pd.DataFrame({"rank": ops["rank"].to_numpy(), "external_id": ops["external_id"].to_numpy(),
                          "op_dtype": own[ops.index].to_numpy()}).drop_duplicates(["rank", "external_id"])
    via_op = (events[["rank", "external_id"]].reset_index(drop=True)
              .merge(keyed, on=["rank", "external_id"], how="left")["op_dtype"])
    via_op.index = events.index
    return own.where(own.notna(), via_op).fillna(default_dtype).astype(str)


def _modules(events: pd.DataFrame) -> pd.Series:
    """Module per row: the `module` column where the producer wrote one (a FusionLens capture
    names the qualified module of every joined op); elsewhere, when the trace has `nn.Module: X`
    python_function scopes (with_stack captures), the innermost one containing each cpu_op on its
    thread, and for GPU rows the module of the cpu_op with their External id."""
    own = events["module"].astype(object)
    return own.where(own.notna(), _scoped_modules(events))


def _scoped_modules(events: pd.DataFrame) -> pd.Series:
    """Module per row from the `nn.Module: X` python_function scopes (None where there are none)."""
    out = pd.Series(None, index=events.index, dtype=object)
    py = events[events["kind"] == "python_function"]
    mods = py[py["name"].astype(str).str.startswith(MODULE_PREFIX)]
    if mods.empty:
        return out
    from profiler.analysis import nesting

    ops = events[events["kind"] == "cpu_op"]
    keys = pd.MultiIndex.from_frame(pd.concat([mods, ops])[["rank", "pid", "tid"]].astype("float64"))
    codes = pd.factorize(keys)[0]
    nest = nesting.build_nest(codes[:len(mods)], mods["ts_us"].to_numpy(float),
                              (mods["ts_us"] + mods["dur_us"]).to_numpy(float))
    pos = nesting.innermost(nest, codes[len(mods):], ops["ts_us"].to_numpy(float))
    label = mods["name"].astype(str).str.removeprefix(MODULE_PREFIX).to_numpy(object)[nest.order]
    out[ops.index] = np.where(pos >= 0, label[np.maximum(pos, 0)], None)
    by_ext = dict(zip(zip(ops["rank"], ops["external_id"]), out[ops.index]))
    gpu = events[events["kind"].isin(("kernel", "gpu_memcpy", "gpu_memset")) & events["external_id"].notna()]
    out[gpu.index] = [by_ext.get(k) for k in zip(gpu["rank"], gpu["external_id"])]
    return out


def roofline_points(trace: Any, ceilings: Ceilings, default_dtype: str = "fp32",
                    kinds: tuple[str, ...] = ("cpu_op", "kernel")) -> tuple[pd.DataFrame, dict[str, int]]:
    """Per-row roofline numbers for rows of `kinds` with known work; returns (points, excluded counts)."""
    fallback = default_dtype if ceilings.peak_for(default_dtype) is not None else "fp32"
    if ceilings.peak_for(fallback) is None:
        raise RooflineError(f"ceilings ({ceilings.source}) have no peak for {default_dtype!r} nor fp32; "
                            f"known: {', '.join(ceilings.peak_flops_per_s)}")
    ev = trace.events
    ev = ev[ev["kind"].isin(kinds)]
    excluded: dict[str, int] = {}
    unknown = ev["flops"].isna() | ev["bytes_moved"].isna()
    excluded["no_flops_or_bytes"] = int(unknown.sum())
    ev = ev[~unknown]
    no_work = (ev["flops"] <= 0) & (ev["bytes_moved"] <= 0)
    zero_dur = ~(ev["dur_us"] > 0)
    excluded["no_work"] = int(no_work.sum())
    excluded["zero_duration"] = int((zero_dur & ~no_work).sum())
    ev = ev[~no_work & ~zero_dur]
    if not len(ev):  # uploaded traces carry no FLOPs: nothing to place, skip the per-row work
        return pd.DataFrame(columns=list(POINT_COLUMNS)), excluded
    dtype = _row_dtypes(ev, default_dtype) if len(ev) else pd.Series([], dtype=str)
    peak_of = {d: ceilings.peak_for(d) for d in set(dtype)}
    missing = sorted(d for d, p in peak_of.items() if p is None)
    roof = dtype
    if missing:  # a dtype the ceilings lack is put under the fallback dtype's roof, counted; the
        # dtype column keeps what the op ran in (fp16 GEMMs under the fp32 roof stay "fp16")
        excluded[f"no_peak_for_{'_'.join(missing)}_used_{fallback}"] = int(dtype.isin(missing).sum())
        roof = dtype.where(~dtype.isin(missing), fallback)
        peak_of[fallback] = ceilings.peak_for(fallback)
    flops = ev["flops"].to_numpy(float)
    nbytes = ev["bytes_moved"].to_numpy(float)
    dur_s = ev["dur_us"].to_numpy(float) / 1e6
    peak = roof.map(peak_of).to_numpy(float)
    bw = ceilings.mem_bw_bytes_per_s
    with np.errstate(divide="ignore", invalid="ignore"):
        intensity = np.where(nbytes > 0, flops / nbytes, np.inf)
    ridge = peak / bw
    time_at_roof_s = np.maximum(flops / peak, nbytes / bw)
    points = pd.DataFrame({
        "event_index": ev.index.to_numpy(), "rank": ev["rank"].to_numpy(), "kind": ev["kind"].astype(str).to_numpy(),
        "name": ev["name"].astype(str).to_numpy(),
        "module": _modules(trace.events).reindex(ev.index).to_numpy(),
        "dtype": dtype.to_numpy(), "ts_us": ev["ts_us"].to_numpy(float), "dur_us": ev["dur_us"].to_numpy(float),
        "flops": flops, "bytes_moved": nbytes, "algorithmic_intensity_flop_per_byte": intensity,
        "achieved_flops_per_s": flops / dur_s, "achieved_bytes_per_s": nbytes / dur_s,
        "peak_flops_per_s": peak, "mem_bw_bytes_per_s": bw, "ridge_flop_per_byte": ridge,
        "bound": np.where(intensity < ridge, "memory", "compute"),
        "time_at_roof_us": time_at_roof_s * 1e6, "pct_of_roof": 100.0 * time_at_roof_s / dur_s,
        "headroom_us": (dur_s - time_at_roof_s) * 1e6, "external_id": ev["external_id"].to_numpy(),
    }, columns=list(POINT_COLUMNS))
    return points, excluded


def aggregate(points: pd.DataFrame, by: tuple[str, ...] = ("kind", "name", "dtype")) -> pd.DataFrame:
    """Sum work and time per group; intensity, achieved rates, bound and % of roof of the sums.

    Sorted by headroom, largest first: the top rows are where a faster kernel would save most.
    """
    cols = ["count", "dur_us", "flops", "bytes_moved", "time_at_roof_us", "headroom_us", "peak_flops_per_s"]
    if points.empty:
        return pd.DataFrame(columns=[*by, *cols, "algorithmic_intensity_flop_per_byte", "achieved_flops_per_s",
                                     "achieved_bytes_per_s", "bound", "pct_of_roof"])
    g = points.groupby(list(by), observed=True, dropna=False, sort=False)
    out = g.agg(count=("dur_us", "size"), dur_us=("dur_us", "sum"), flops=("flops", "sum"),
                bytes_moved=("bytes_moved", "sum"), time_at_roof_us=("time_at_roof_us", "sum"),
                headroom_us=("headroom_us", "sum"), peak_flops_per_s=("peak_flops_per_s", "max"),
                mem_bw_bytes_per_s=("mem_bw_bytes_per_s", "first")).reset_index()
    return _derived(out, out.pop("mem_bw_bytes_per_s"))


def _derived(out: pd.DataFrame, mem_bw_bytes_per_s: Any) -> pd.DataFrame:
    """Sums per group -> intensity, achieved rates, bound and % of roof; largest headroom first."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out["algorithmic_intensity_flop_per_byte"] = np.where(out["bytes_moved"] > 0, out["flops"] / out["bytes_moved"], np.inf)
    dur_s = out["dur_us"] / 1e6
    out["achieved_flops_per_s"] = out["flops"] / dur_s
    out["achieved_bytes_per_s"] = out["bytes_moved"] / dur_s
    ridge = out["peak_flops_per_s"] / mem_bw_bytes_per_s
    out["bound"] = np.where(out["algorithmic_intensity_flop_per_byte"] < ridge, "memory", "compute")
    out["pct_of_roof"] = 100.0 * out["time_at_roof_us"] / out["dur_us"]
    return out.sort_values("headroom_us", ascending=False, kind="stable").reset_index(drop=True)


SUMMED = ("count", "dur_us", "flops", "bytes_moved", "time_at_roof_us", "headroom_us")


def rollup_modules(table: pd.DataFrame, depth: int, mem_bw_bytes_per_s: float) -> pd.DataFrame:
    """A per-module table (roofline_modules.csv: each module's own ops) summed up the module tree
    to `depth` name segments: at depth 3, `GPT.blocks.0` holds its own ops and all of its
    children's (`GPT.blocks.0.attn.qkv`, ...). Shallower modules stay as they are. Intensity,
    bound and % of roof are those of the sums, against the same memory roof."""
    if depth < 1:
        raise RooflineError(f"module depth must be >= 1, got {depth}")
    if table.empty:
        return table.copy()
    names = table["module"].astype(str).str.split(".").str[:depth].str.join(".")
    grouped = table.assign(module=names).groupby(["module", "dtype"], observed=True, sort=False)
    out = grouped.agg({**{c: "sum" for c in SUMMED}, "peak_flops_per_s": "max"}).reset_index()
    return _derived(out, mem_bw_bytes_per_s)


MEASURE_HINT = "pass measured ceilings (profiler.capture.ceilings.measured_ceilings) for this machine"


def resolve_ceilings(trace: Any, ceilings: Optional[Ceilings],
                     hint: str = MEASURE_HINT) -> tuple[Optional[Ceilings], Optional[str]]:
    """The caller's ceilings, else those a FusionLens capture recorded with the trace (measured on
    the machine that ran it, or its table entry), else the device table entry for the trace's
    device; (None, reason) if none. `hint` ends the reason: how this caller's user gets measured roofs."""
    if ceilings is not None:
        return ceilings, None
    recorded = (trace.meta.get("capture") or {}).get("roofline_ceilings")
    if recorded:
        return Ceilings.from_json(recorded), None
    match = ceilings_from_meta(trace.meta)
    if match.spec is None:
        return None, f"no ceilings: {match.reason}; {hint}"
    return match.ceilings, None


@register_analysis("roofline", "Roofline",
                   "Each op and kernel against the roof: algorithmic intensity, % of roof, headroom")
def roofline(trace: Any, ceilings: Optional[Ceilings] = None, default_dtype: str = "fp32") -> RooflineResult:
    """Roofline of `trace` against `ceilings` (default: the device table entry from the trace's meta)."""
    resolved, reason = resolve_ceilings(trace, ceilings)
    if resolved is None:
        empty = aggregate(pd.DataFrame(columns=list(POINT_COLUMNS)))
        return RooflineResult(pd.DataFrame(columns=list(POINT_COLUMNS)), empty, None, None, {}, reason)
    points, excluded = roofline_points(trace, resolved, default_dtype)
    by_module = _by_module(points) if points["module"].notna().any() else None
    why = None if len(points) else "no op or kernel carries FLOPs and bytes (uploaded traces do not record them)"
    return RooflineResult(points, aggregate(points), by_module, resolved, excluded, why)


def _by_module(points: pd.DataFrame) -> pd.DataFrame:
    """Per (module, dtype) over the points whose module is known (empty when none is)."""
    return aggregate(points[points["module"].notna()], ("module", "dtype"))


def roofline_table(trace: Any, ceilings: Ceilings, default_dtype: str = "fp32") -> pd.DataFrame:
    """Per op type (kind, name, dtype) roofline table for the capture CLI, largest headroom first."""
    return roofline_tables(trace, ceilings, default_dtype)[0]


def roofline_tables(trace: Any, ceilings: Ceilings, default_dtype: str = "fp32") -> tuple[pd.DataFrame, pd.DataFrame]:
    """The capture's two roofline tables from one set of points: per op type (kind, name, dtype)
    and per (module, dtype) over the ops whose module is known (empty when none is)."""
    points, _ = roofline_points(trace, ceilings, default_dtype)
    return aggregate(points), _by_module(points)
