"""Distributed view: communication time, comm/compute overlap, collective sizes, stragglers.

Per rank:
- `comm_comp_overlap`: communication kernel time, and the share of it that runs while a
  computation kernel runs on the same rank (HTA's definition: overlapped comm time / comm time,
  both as unions so two collectives running at once count once).
- `collectives`: communication kernels grouped by collective, process group, dtype and size;
  sizes from the NCCL/RCCL args (`In/Out msg nelems` x dtype size), taken from the kernel row,
  else from the launching op with the same External id (`record_param_comms`).
Across ranks (`stragglers`): see `stragglers` for the rule. Collectives are matched across ranks
by their order within a process group; clocks are aligned on collective *ends* (all ranks leave
a collective together), falling back to the Trace's common origin (the earliest event).

CPU runs (DDP over gloo): a rank with no GPU communication kernels has no kernels at all to time
its collectives by, but its CPU process group records each collective it runs as a user
annotation `<backend>:<collective>` on its worker thread (ProcessGroupGloo: `gloo:all_reduce`).
Those spans are that rank's communication, and its computation is the CPU ops of the other
threads (minus the `c10d::` ops, which issue or wait for collectives): see `cpu_comm`, which the
step breakdown shares.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.analysis import cpu_comm
from profiler.analysis import intervals as iv
from profiler.analysis import kernel_types as kt
from profiler.analysis.registry import register_analysis

# Bytes per element of the dtype names NCCL args use (PyTorch scalar type names), lower-cased.
DTYPE_BYTES: dict[str, int] = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
    "c10::half": 2, "c10::bfloat16": 2, "long": 8, "int64": 8, "long int": 8, "int": 4, "int32": 4,
    "short": 2, "int16": 2, "byte": 1, "uint8": 1, "char": 1, "int8": 1, "bool": 1,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
    "complexfloat": 8, "complexdouble": 16, "complexhalf": 4,
}
ROBUST_Z = 3.5      # Iglewicz-Hoaglin cut-off for the modified z-score
REL_TOL = 0.10      # and at least 10% of the scale, so tiny spreads do not flag noise


def _gpu_typed(trace) -> pd.DataFrame:
    """GPU activity rows (only the columns used here) with their kernel type, sorted by rank."""
    ev = trace.events
    g = ev.loc[ev["kind"].isin(kt.GPU_ACTIVITY_KINDS).to_numpy(), ["rank", "kind", "name", "ts_us", "dur_us",
                                                                  "collective_name"]]
    g = g.assign(kernel_type=kt.kernel_type(g).to_numpy())
    return g.sort_values("rank", kind="stable")


def _cpu_busy(trace) -> dict[int, tuple[iv.Intervals, iv.Intervals, int, float]]:
    """Per CPU-communicating rank: (collective-span union, compute union, spans, summed span time).

    Compute: the time CPU ops run on the threads that run no collective span, minus the time inside
    `c10d::` ops (issuing a collective or blocking on it is not computation, and DDP's gradient
    hooks, which are ops themselves, block inside them)."""
    ev = trace.events
    coll = cpu_comm.collective_span_mask(ev)
    out: dict[int, tuple[iv.Intervals, iv.Intervals, int, float]] = {}
    if not coll.any():
        return out
    is_op = (ev["kind"] == "cpu_op").to_numpy()
    ops = ev.loc[is_op, ["rank", "tid", "ts_us", "dur_us"]]
    c10d = cpu_comm.c10d_op_mask(ev)[is_op]
    spans = ev.loc[coll, ["rank", "tid", "ts_us", "dur_us"]]

    def union(rows: pd.DataFrame) -> iv.Intervals:
        return iv.union(rows["ts_us"].to_numpy(float), (rows["ts_us"] + rows["dur_us"]).to_numpy(float))

    for rank, c in spans.groupby("rank", sort=True):  # one iteration per CPU rank
        mine = ((ops["rank"] == rank) & ~ops["tid"].isin(c["tid"].unique())).to_numpy()
        compute = iv.difference(union(ops[mine & ~c10d]), union(ops[mine & c10d]))
        out[int(rank)] = (union(c), compute, len(c), float(c["dur_us"].sum()))
    return out


@register_analysis("comm_comp_overlap", "Communication / computation overlap",
                   "Per rank: communication kernel time and the % of it overlapped by computation")
def comm_comp_overlap(trace) -> pd.DataFrame:
    """Columns: rank, comm_kernels, comm_us (sum), comm_busy_us (union), compute_busy_us,
    overlap_us, overlap_pct (NaN without communication), exposed_comm_us. On a CPU rank (see the
    module docstring) comm_kernels counts its process group's collective spans."""
    g = _gpu_typed(trace)
    cpu = _cpu_busy(trace)
    ranks = g["rank"].to_numpy()
    ts, end = g["ts_us"].to_numpy(float), (g["ts_us"] + g["dur_us"]).to_numpy(float)
    ktype = g["kernel_type"].to_numpy()
    rows = []
    for rank in sorted(int(r) for r in trace.events["rank"].unique()):  # one iteration per rank
        lo, hi = np.searchsorted(ranks, rank, "left"), np.searchsorted(ranks, rank, "right")
        t, e, k = ts[lo:hi], end[lo:hi], ktype[lo:hi]
        comm, comp = k == kt.COMMUNICATION, k == kt.COMPUTATION
        cu, pu = iv.union(t[comm], e[comm]), iv.union(t[comp], e[comp])
        n_comm, comm_us = int(comm.sum()), float((e - t)[comm].sum())
        if rank in cpu:  # gloo & co: their spans; CPU compute unless the rank computes on a GPU
            cu, cpu_pu, n_comm, comm_us = cpu[rank]
            pu = pu if comp.any() else cpu_pu
        both = iv.intersection_length(cu, pu)
        rows.append({"rank": rank, "comm_kernels": n_comm, "comm_us": comm_us,
                     "comm_busy_us": cu.total_us, "compute_busy_us": pu.total_us, "overlap_us": both,
                     "overlap_pct": 100.0 * both / cu.total_us if cu.total_us > 0 else np.nan,
                     "exposed_comm_us": cu.total_us - both})
    return pd.DataFrame(rows, columns=["rank", "comm_kernels", "comm_us", "comm_busy_us", "compute_busy_us",
                                       "overlap_us", "overlap_pct", "exposed_comm_us"])


def comm_rows(trace) -> pd.DataFrame:
    """Communication kernels with collective, process group, dtype and element counts filled in;
    on CPU ranks, their process group's collective spans (sizes unknown: NaN)."""
    ev = trace.events
    cpu_coll = cpu_comm.collective_span_mask(ev)
    kernel = (ev["kind"] == "kernel").to_numpy()
    comm = np.zeros(len(ev), bool)
    comm[kernel] = kt.is_communication(ev.loc[kernel])
    g = ev.loc[comm | cpu_coll]
    cols = ["rank", "name", "ts_us", "dur_us", "stream", "external_id", "collective_name", "in_msg_nelems",
            "out_msg_nelems", "group_size", "comm_dtype", "process_group_name"]
    out = g[cols].copy()
    for c in ("collective_name", "comm_dtype", "process_group_name"):
        out[c] = out[c].astype("string")
    # Missing args on the kernel: take them from the op that launched it (same External id).
    ops = ev.loc[(ev["kind"] == "cpu_op") & ev["in_msg_nelems"].notna() & ev["external_id"].notna(),
                 ["rank", "external_id", "collective_name", "in_msg_nelems", "out_msg_nelems", "group_size",
                  "comm_dtype", "process_group_name"]].drop_duplicates(["rank", "external_id"])
    if len(ops) and out["in_msg_nelems"].isna().any():
        ops = ops.astype({c: "string" for c in ("collective_name", "comm_dtype", "process_group_name")})
        m = out[["rank", "external_id"]].merge(ops, on=["rank", "external_id"], how="left")
        for c in ("collective_name", "in_msg_nelems", "out_msg_nelems", "group_size", "comm_dtype", "process_group_name"):
            out[c] = out[c].fillna(pd.Series(m[c].to_numpy(), index=out.index).astype(out[c].dtype))
    from_kernel = kt.collective(g).astype("string")
    spans = g["kind"].to_numpy() == "user_annotation"  # CPU collective spans: "gloo:all_reduce"
    if spans.any():
        op = g.loc[spans, "name"].astype("string").str.split(":", n=1).str[1].fillna("")
        label = pd.Series(kt.first_label(op.tolist(), kt.COLLECTIVE_PATTERNS), index=op.index, dtype="string")
        from_kernel.loc[spans] = label.fillna("other")
    out["collective"] = from_kernel.to_numpy()
    size = out["comm_dtype"].str.lower().map(DTYPE_BYTES).astype("Float64")
    out["in_bytes"] = (out["in_msg_nelems"].astype("Float64") * size).astype("Float64")
    out["out_bytes"] = (out["out_msg_nelems"].astype("Float64") * size).astype("Float64")
    return out.sort_values(["rank", "ts_us"], kind="stable").reset_index(drop=True)


@register_analysis("collectives", "Collective sizes",
                   "Per rank: collectives by type, process group, dtype and message size, with bandwidth")
def collectives(trace) -> pd.DataFrame:
    """Columns: rank, collective, process_group_name, comm_dtype, in_bytes, out_bytes, count,
    total_us, mean_us, algbw_gb_s (max(in,out) bytes / mean time; NaN when sizes are unknown)."""
    c = comm_rows(trace)
    keys = ["rank", "collective", "process_group_name", "comm_dtype", "in_bytes", "out_bytes"]
    out = (c.groupby(keys, dropna=False, sort=False, observed=True)
           .agg(count=("dur_us", "size"), total_us=("dur_us", "sum"), mean_us=("dur_us", "mean")).reset_index())
    moved = np.fmax(out["in_bytes"].astype("float64").to_numpy(), out["out_bytes"].astype("float64").to_numpy())
    with np.errstate(invalid="ignore", divide="ignore"):
        out["algbw_gb_s"] = np.where(out["mean_us"] > 0, moved / (out["mean_us"].to_numpy() * 1e3), np.nan)
    return out.sort_values(["rank", "total_us"], ascending=[True, False], ignore_index=True)


def matched_collectives(trace, align: str = "collective_end") -> pd.DataFrame:
    """One row per (process group, sequence number, rank) for collectives seen on every rank.

    Columns: pg, seq, rank, start_us, end_us (aligned), lateness_us (start minus the earliest
    start of that collective), wait_us (latest start minus own start), offset_us (clock shift
    applied to the rank). `align`: "collective_end" (shift each rank so the median end of its
    matched collectives equals the reference rank's) or "trace" (the Trace's common origin).
    """
    if align not in ("collective_end", "trace"):
        raise ValueError(f"align must be 'collective_end' or 'trace', not {align!r}")
    c = comm_rows(trace)
    # Process groups only when every rank names them; else one sequence per rank.
    pg = c["process_group_name"].fillna("") if c["process_group_name"].notna().all() else ""
    c = c.assign(pg=pg, end_us=c["ts_us"] + c["dur_us"])
    c["seq"] = c.groupby(["rank", "pg"], sort=False).cumcount()
    n_ranks = c.groupby("pg")["rank"].transform("nunique")
    c = c[(c.groupby(["pg", "seq"])["rank"].transform("nunique") == n_ranks) & (n_ranks > 1)]
    c = c.rename(columns={"ts_us": "start_us"})[["pg", "seq", "rank", "start_us", "end_us"]].reset_index(drop=True)
    offset = pd.Series(0.0, index=pd.Index(sorted(c["rank"].unique()), name="rank"))
    if align == "collective_end" and c["rank"].nunique() > 1:
        ref = c.groupby(["pg", "seq"])["end_us"].transform("min")
        offset = (c["end_us"] - ref).groupby(c["rank"]).median()
        offset = offset - offset.min()
    c["offset_us"] = c["rank"].map(offset).astype("float64")
    c["start_us"] -= c["offset_us"]
    c["end_us"] -= c["offset_us"]
    first = c.groupby(["pg", "seq"])["start_us"].transform("min")
    last = c.groupby(["pg", "seq"])["start_us"].transform("max")
    c["lateness_us"] = c["start_us"] - first
    c["wait_us"] = last - c["start_us"]
    return c


def _rank_metrics(trace, align: str) -> pd.DataFrame:
    """Per rank: median step time, compute time per step, median collective lateness and wait."""
    from profiler.analysis.breakdown import step_windows  # sibling analysis module

    ranks = pd.Index(sorted(int(r) for r in trace.events["rank"].unique()), name="rank")
    steps = step_windows(trace)
    has_steps = steps["step"].notna()
    step_us = steps[has_steps].groupby("rank")["duration_us"].median().reindex(ranks)
    n_steps = steps[has_steps].groupby("rank").size().reindex(ranks).fillna(0).astype(int)
    g = _gpu_typed(trace)
    comp = g[g["kernel_type"] == kt.COMPUTATION]
    busy = iv.union_by_group(comp["rank"].to_numpy(np.int64), comp["ts_us"], comp["ts_us"] + comp["dur_us"])
    busy_us = busy.total_by_group().reindex(ranks).fillna(0.0)
    for rank, (_, cpu_compute, _, _) in _cpu_busy(trace).items():  # CPU ranks: their CPU compute
        if busy_us.get(rank, 0.0) == 0.0:  # (a rank with GPU computation keeps that)
            busy_us[rank] = cpu_compute.total_us
    compute = busy_us / n_steps.clip(lower=1)
    m = matched_collectives(trace, align)
    per = m.groupby("rank")
    period = (m.sort_values(["rank", "start_us"]).groupby("rank")["start_us"].diff()).groupby(m["rank"]).median()
    return pd.DataFrame({
        "n_steps": n_steps, "step_us": step_us, "compute_us": compute,
        "n_collectives": per.size().reindex(ranks).fillna(0).astype(int),
        "coll_late_us": per["lateness_us"].median().reindex(ranks),
        "coll_wait_us": per["wait_us"].median().reindex(ranks),
        "coll_period_us": period.reindex(ranks), "clock_offset_us": per["offset_us"].first().reindex(ranks),
    })


def _leave_one_out(x: pd.Series, scale: pd.Series | None = None, z_cut: float = ROBUST_Z,
                   rel_tol: float = REL_TOL) -> tuple[np.ndarray, np.ndarray]:
    """Per rank: (robust z vs the other ranks, flagged). Flagged when x - median(others) exceeds
    max(z_cut * 1.4826 * MAD(others), rel_tol * scale), scale defaulting to median(others)."""
    v = x.to_numpy(np.float64)
    z = np.full(len(v), np.nan)
    flag = np.zeros(len(v), bool)
    if len(v) < 2:
        return z, flag
    # Leave-one-out over ranks: a loop over ranks (tens), not over events.
    for i in range(len(v)):
        others = np.delete(v, i)
        others = others[~np.isnan(others)]
        if np.isnan(v[i]) or len(others) == 0:
            continue
        med = np.median(others)
        sigma = 1.4826 * np.median(np.abs(others - med))
        if scale is None:
            sc = med
        else:  # the others' scale; NaN when none has one (e.g. a single collective per rank)
            rest = np.delete(scale.to_numpy(np.float64), i)
            rest = rest[~np.isnan(rest)]
            sc = float(np.median(rest)) if len(rest) else np.nan
        if sigma > 0:
            z[i] = (v[i] - med) / sigma
        cut = max(z_cut * sigma, rel_tol * (sc if np.isfinite(sc) else 0.0))
        flag[i] = (v[i] - med) > cut and cut > 0
    return z, flag


@register_analysis("stragglers", "Stragglers across ranks",
                   "Ranks whose step time, compute time or collective arrival is out of line", needs_ranks=2)
def stragglers(trace, align: str = "collective_end", z_cut: float = ROBUST_Z, rel_tol: float = REL_TOL) -> pd.DataFrame:
    """Per rank metrics, robust z-scores and a `straggler` flag with its `reason`.

    Rule: a rank is a straggler when, for step time, compute time per step or median collective
    lateness, its value exceeds the median of the *other* ranks by more than
    max(z_cut x 1.4826 x MAD(others), rel_tol x scale); the scale is that median for times and
    the median collective period (time between collective starts) for lateness. Leave-one-out
    keeps one slow rank of two from hiding inside its own median.
    """
    m = _rank_metrics(trace, align)
    reasons = pd.Series("", index=m.index, dtype=object)
    flagged = np.zeros(len(m), bool)
    checks = (("step_us", None, "step time"), ("compute_us", None, "compute time per step"),
              ("coll_late_us", m["coll_period_us"], "late at collectives"))
    for col, scale, label in checks:
        z, f = _leave_one_out(m[col], scale, z_cut, rel_tol)
        m[f"{col}_z"] = z
        flagged |= f
        reasons[f] = [f"{r}; {label}" if r else label for r in reasons[f]]  # per flagged rank
    m["straggler"] = flagged
    m["reason"] = reasons.where(flagged, "")
    return m.reset_index()
