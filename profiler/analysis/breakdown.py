"""Where the step time goes: the TensorBoard-style step breakdown and HTA's temporal breakdown.

`step_breakdown` (per rank and ProfilerStep) counts every µs of a step once, in priority order
`kernel > memcpy > memset > communication > runtime > cpu_only > other > idle`, as the
TensorBoard profiler's overview did: a µs where a kernel runs is `kernel` even if a memcpy and a
runtime call overlap it; a µs covered only by a CPU op is `cpu_only`; a µs with nothing at all is
`idle`. Categories:
- kernel: GPU kernels of type computation (and memory-like kernels launched as kernels);
- memcpy / memset: `gpu_memcpy` / `gpu_memset` rows;
- communication: communication kernels (NCCL/RCCL/... see `kernel_types`). They are not
  `kernel`: a µs where only a collective runs is communication time. Because `kernel` ranks
  first, a µs where a computation kernel overlaps a collective counts as kernel (the collective
  is hidden there); only exposed communication shows up as communication. On a rank whose
  collectives run on a CPU process group (DDP over gloo; `cpu_comm`), its `c10d::` ops and the
  CPU ops of its worker threads rank here too, and the collective spans rank just below
  cpu_only: CPU compute hides them, as a kernel hides a GPU collective (`LEVELS`);
- runtime: `cuda_runtime`, `cuda_driver` and `cuda_sync` rows (host side of launches, syncs);
- cpu_only: `cpu_op` rows (TensorBoard's "CPU Exec");
- other: remaining host annotations (`python_function`, `user_annotation` other than the
  `ProfilerStep#N` markers themselves);
- idle: none of the above.

Step windows follow TensorBoard's rule: a step starts at its `ProfilerStep#N` start (but not
before the previous step's end) and ends at the later of its CPU end and the end of the last GPU
activity launched in it (the `step` column). Without ProfilerStep markers a rank is one window
over all its events (`step` <NA>, `step_name` "all").

`temporal` is HTA's temporal breakdown, per rank on the GPU: `span_us` from the first to the last
GPU activity (kernel, memcpy, memset), `compute_us` = union of computation kernels,
`non_compute_us` = time where only communication/memory runs, `idle_us` = span minus the union of
all GPU activity. Overlaps count once, so `idle + compute + non_compute == span`.

HTA drops GPU activity whose correlation matches no runtime call (typically work enqueued before
the profiler started); we keep it, since it ran inside the trace. `temporal(trace,
launched_only=True)` drops it too and then reproduces HTA 0.2's numbers exactly (checked on
hta_a100_80gb_rank0of16_queue_length: span 1,229,072, compute 179,676, non-compute 201,180,
idle 848,216 µs; HTA also truncates fractional µs, so traces with ns-resolution times differ
slightly).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from profiler.analysis import cpu_comm
from profiler.analysis import intervals as iv
from profiler.analysis import kernel_types as kt
from profiler.analysis.registry import register_analysis
from profiler.trace.links import step_number

# The step breakdown's categories (output columns) ...
CATEGORIES: tuple[str, ...] = ("kernel", "memcpy", "memset", "communication", "runtime", "cpu_only", "other")
# ... and its priority levels (first wins where rows overlap). Communication has two: GPU
# collectives and the CPU ops that do a CPU process group's communication rank above CPU compute;
# a CPU collective span itself ranks below it, so compute that overlaps it hides it, as a
# computation kernel hides a GPU collective.
LEVELS: tuple[str, ...] = ("kernel", "memcpy", "memset", "communication", "runtime", "cpu_only", "communication",
                           "other")
STEP_PREFIX = "ProfilerStep#"
_RUNTIME_KINDS = ("cuda_runtime", "cuda_driver", "cuda_sync")
_OTHER_KINDS = ("python_function", "user_annotation")


def _step_numbers(names: pd.Series) -> np.ndarray:
    """int64 N per row named `ProfilerStep#N` (the trace's own rule, links.step_number), -1 elsewhere:
    a name like `ProfilerStep#0.5` or one with 20 digits is no marker, here as in the `step` column."""
    def numbers(cats: list) -> np.ndarray:
        return np.array([-1 if (n := step_number(str(c))) is None else n for c in cats], dtype=np.int64)

    out = kt.per_distinct(names, numbers)
    out[names.isna().to_numpy()] = -1  # per_distinct fills missing names with 0
    return out


def _is_step_marker(names: pd.Series) -> np.ndarray:
    return _step_numbers(names) >= 0


def step_windows(trace) -> pd.DataFrame:
    """One row per (rank, step): `rank, step, step_name, start_us, end_us, duration_us`.

    TensorBoard's rule (see module doc). Ranks without ProfilerStep markers get one window over
    all their events with `step` <NA> and `step_name` "all".
    """
    ev = trace.events
    numbers = _step_numbers(ev["name"])
    marker = (numbers >= 0) & (~ev["kind"].isin(kt.GPU_ACTIVITY_KINDS + ("gpu_user_annotation",))).to_numpy()
    steps = ev.loc[marker, ["rank", "ts_us", "dur_us"]].copy()
    steps["step"] = pd.array(numbers[marker], dtype="Int32")
    steps = (steps.assign(end_us=steps["ts_us"] + steps["dur_us"])
             .groupby(["rank", "step"], as_index=False, observed=True)
             .agg(start_us=("ts_us", "min"), cpu_end_us=("end_us", "max")))
    # Device end of each step: the last GPU activity attributed to it.
    gpu = ev[ev["kind"].isin(kt.GPU_ACTIVITY_KINDS) & ev["step"].notna()]
    if len(gpu):
        gend = (gpu.assign(end_us=gpu["ts_us"] + gpu["dur_us"])
                .groupby(["rank", "step"], as_index=False, observed=True)["end_us"].max()
                .rename(columns={"end_us": "gpu_end_us"}))
        steps = steps.merge(gend.astype({"step": "Int32"}), on=["rank", "step"], how="left")
    else:
        steps["gpu_end_us"] = np.nan
    steps = steps.sort_values(["rank", "start_us"], kind="stable").reset_index(drop=True)
    end = np.fmax(steps["cpu_end_us"].to_numpy(float), steps["gpu_end_us"].to_numpy(float))
    # Not before any earlier step of the rank has ended (a cumulative max, so one step whose GPU
    # work ran very late cannot make a later window overlap it).
    reach = pd.Series(end).groupby(steps["rank"].to_numpy()).cummax()
    prev_end = reach.groupby(steps["rank"].to_numpy()).shift(1).to_numpy()
    start = np.fmax(steps["start_us"].to_numpy(float), prev_end)  # not before the previous step ends
    steps["start_us"] = start
    steps["end_us"] = np.maximum(end, start)
    steps["step_name"] = STEP_PREFIX + steps["step"].astype(str)
    # Ranks without steps: one window over everything they recorded.
    no_step_ranks = np.setdiff1d(ev["rank"].unique(), steps["rank"].unique())
    if len(no_step_ranks):
        rest = ev[ev["rank"].isin(no_step_ranks)]
        whole = (rest.assign(end_us=rest["ts_us"] + rest["dur_us"]).groupby("rank", as_index=False)
                 .agg(start_us=("ts_us", "min"), end_us=("end_us", "max")))
        whole["step"] = pd.array([pd.NA] * len(whole), dtype="Int32")
        whole["step_name"] = "all"
        steps = pd.concat([steps, whole], ignore_index=True)
    out = steps[["rank", "step", "step_name", "start_us", "end_us"]].copy()
    out["rank"] = out["rank"].astype("int32")
    out["step"] = out["step"].astype("Int32")
    out["duration_us"] = out["end_us"] - out["start_us"]
    return out.sort_values(["rank", "start_us"], kind="stable").reset_index(drop=True)


_CPU_COMM_SPAN_LEVEL = len(LEVELS) - 2  # the second "communication", below cpu_only


def _level_codes(ev: pd.DataFrame) -> np.ndarray:
    """Index into LEVELS per row, -1 for rows that count nowhere (markers, GPU annotations)."""
    kind = ev["kind"]  # categorical: comparisons run on its integer codes
    code = np.full(len(ev), -1, dtype=np.int8)
    is_kernel = (kind == "kernel").to_numpy()
    code[is_kernel] = LEVELS.index("kernel")
    code[(kind == "gpu_memcpy").to_numpy()] = LEVELS.index("memcpy")
    code[(kind == "gpu_memset").to_numpy()] = LEVELS.index("memset")
    code[is_kernel & kt.is_communication(ev)] = LEVELS.index("communication")
    code[kind.isin(_RUNTIME_KINDS).to_numpy()] = LEVELS.index("runtime")
    code[(kind == "cpu_op").to_numpy()] = LEVELS.index("cpu_only")
    code[kind.isin(_OTHER_KINDS).to_numpy()] = LEVELS.index("other")
    spans = cpu_comm.collective_span_mask(ev)
    if spans.any():  # a CPU process group's communication (DDP over gloo): see cpu_comm
        code[cpu_comm.communication_op_mask(ev, spans)] = LEVELS.index("communication")
        code[spans] = _CPU_COMM_SPAN_LEVEL
    code[_is_step_marker(ev["name"])] = -1  # the step markers span the whole step
    return code


@register_analysis("step_breakdown", "Step time breakdown",
                   "Per rank and ProfilerStep: kernel, memcpy, memset, communication, runtime, CPU-only, "
                   "other, idle; each µs counted once")
def step_breakdown(trace) -> pd.DataFrame:
    """Per (rank, step): window and µs per category in priority order; categories sum to duration.

    Returns columns `rank, step, step_name, start_us, end_us, duration_us, <category>_us...,
    idle_us` (see `CATEGORIES`).
    """
    ev = trace.events
    win = step_windows(trace)
    codes = _level_codes(ev)
    rank = ev["rank"].to_numpy(np.int64)
    ts = ev["ts_us"].to_numpy(np.float64)
    end = ts + ev["dur_us"].to_numpy(np.float64)
    wr = win["rank"].to_numpy(np.int64)
    ws, we = win["start_us"].to_numpy(), win["end_us"].to_numpy()
    out = win.copy()
    for cat in CATEGORIES:
        out[f"{cat}_us"] = 0.0
    covered_prev = np.zeros(len(win))
    cum: iv.GroupedIntervals | None = None
    for k, cat in enumerate(LEVELS):  # loop over 8 priority levels, not events
        sel = codes == k
        if not sel.any() and cum is not None:
            continue
        own = iv.union_by_group(rank[sel], ts[sel], end[sel])
        cum = own if cum is None else iv.union_by_group(
            np.concatenate([cum.groups, own.groups]), np.concatenate([cum.starts, own.starts]),
            np.concatenate([cum.ends, own.ends]))
        covered = iv.covered_in_windows_by_group(cum, wr, ws, we)
        out[f"{cat}_us"] += np.maximum(covered - covered_prev, 0.0)
        covered_prev = covered
    out["idle_us"] = np.maximum(out["duration_us"].to_numpy() - covered_prev, 0.0)
    return out


LAUNCH_KINDS: tuple[str, ...] = ("cuda_runtime", "cuda_driver")


def gpu_activity(trace, with_launch: bool = False) -> pd.DataFrame:
    """Kernel, memcpy and memset rows with their `kernel_type` and `end_us`.

    With `with_launch`, adds the host call that enqueued each row, matched by correlation id on
    the same rank: `launch_name`, `launch_ts_us`, `launch_dur_us` (NaN when unmatched). Rows of one
    CUDA/HIP graph share their `cudaGraphLaunch` correlation, so they all get that call.
    """
    g = trace.of_kind(*kt.GPU_ACTIVITY_KINDS)
    g = g.assign(kernel_type=kt.kernel_type(g), end_us=g["ts_us"] + g["dur_us"])
    if not with_launch:
        return g
    rt = trace.of_kind(*LAUNCH_KINDS)
    rt = (rt.loc[rt["correlation"].notna(), ["rank", "correlation", "name", "ts_us", "dur_us"]]
          .sort_values("ts_us", kind="stable").drop_duplicates(["rank", "correlation"]))
    rt = rt.rename(columns={"name": "launch_name", "ts_us": "launch_ts_us", "dur_us": "launch_dur_us"})
    keys = g[["rank", "correlation"]].reset_index()
    m = keys.merge(rt, on=["rank", "correlation"], how="left").set_index("index")
    return g.assign(launch_name=m["launch_name"], launch_ts_us=m["launch_ts_us"].astype(float),
                    launch_dur_us=m["launch_dur_us"].astype(float))


@register_analysis("temporal", "GPU temporal breakdown",
                   "Per rank: compute, non-compute (communication/memory only) and idle time over the GPU span (HTA)")
def temporal(trace, launched_only: bool = False) -> pd.DataFrame:
    """Per rank: `rank, span_us, compute_us, non_compute_us, idle_us` and their `*_pct` of span.

    `launched_only` keeps only GPU activity with a matched launch call (HTA's behaviour).
    """
    g = gpu_activity(trace, with_launch=launched_only)
    if launched_only:
        g = g[g["launch_ts_us"].notna()]
    ranks = np.asarray(sorted(set(trace.ranks) | set(g["rank"].unique().tolist())), dtype=np.int64)
    rank = g["rank"].to_numpy(np.int64)
    ts, end = g["ts_us"].to_numpy(float), g["end_us"].to_numpy(float)
    comp = (g["kernel_type"] == kt.COMPUTATION).to_numpy()
    busy = iv.union_by_group(rank, ts, end).total_by_group().reindex(ranks, fill_value=0.0)
    compute = iv.union_by_group(rank[comp], ts[comp], end[comp]).total_by_group().reindex(ranks, fill_value=0.0)
    first = pd.Series(ts).groupby(rank).min().reindex(ranks)
    last = pd.Series(end).groupby(rank).max().reindex(ranks)
    span = (last - first).fillna(0.0)
    out = pd.DataFrame({"rank": ranks.astype("int32"), "span_us": span.to_numpy(),
                        "compute_us": compute.to_numpy(), "non_compute_us": (busy - compute).to_numpy(),
                        "idle_us": (span - busy).clip(lower=0.0).to_numpy()})
    with np.errstate(invalid="ignore", divide="ignore"):
        for c in ("compute", "non_compute", "idle"):
            out[f"{c}_pct"] = np.where(out["span_us"] > 0, 100.0 * out[f"{c}_us"] / out["span_us"], np.nan)
    return out
