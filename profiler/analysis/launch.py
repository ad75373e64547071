"""Launch analysis: launch delay, CPU time in launch calls, short kernels, and "is it launch-bound?".

Launch delay of a kernel = its GPU start minus the start of the host call that enqueued it
(`cudaLaunchKernel`, `cuLaunchKernel`, `hipExtModuleLaunchKernel`, `cudaGraphLaunch`, ...),
matched by correlation id on the same rank. Kernels replayed from a CUDA/HIP graph share the
graph launch's correlation, so their delay is measured from `cudaGraphLaunch`. Outliers are
delays above `median + k * 1.4826 * MAD` (a robust z-score of k, default 5; at least 1 µs above
the median).

Verdict. A run is launch-bound when the GPU waits on the launches rather than on work: all of
- the GPU is busy (union of its activity) less than `busy_threshold` (80%) of its span;
- at least `empty_queue_threshold` (50%) of kernels were launched into an empty stream queue
  (everything enqueued before them on their stream had finished: the stream waited for the host
  to issue them; HTA's "queue length 0");
- at least `short_share_threshold` (50%) of kernels are shorter than 10 µs, i.e. comparable to a
  launch's own cost, so per-kernel overhead (not a stall such as a data-loader wait) starves it.
Each condition is reported with its number as evidence; `host_wait_us` (from `idle`) is the time
the streams sat empty waiting for the host, an upper bound on what CUDA graphs or fusion can win.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profiler.analysis import intervals as iv
from profiler.analysis.idle import DEFAULT_KERNEL_WAIT_THRESHOLD_US, _gaps, stream_order
from profiler.analysis.kernel_types import NamePattern, names_match
from profiler.analysis.registry import register_analysis

# Host calls that enqueue kernels (CUDA runtime and driver, HIP, graph replays).
LAUNCH_API_PATTERNS: tuple[NamePattern, ...] = (
    NamePattern("cuda_runtime_launch", r"^cudaLaunch(Cooperative)?Kernel", "cudaLaunchKernel, cudaLaunchKernelExC, ..."),
    NamePattern("cuda_driver_launch", r"^cuLaunch(Cooperative)?Kernel", "cuLaunchKernel(Ex): Triton and other JITs"),
    NamePattern("cuda_graph_launch", r"^cudaGraphLaunch|^cuGraphLaunch", "CUDA graph replay"),
    NamePattern("hip_launch", r"^hip(Ext)?(Module)?Launch(Cooperative)?Kernel", "hipLaunchKernel, hipExtModuleLaunchKernel, ..."),
    NamePattern("hip_graph_launch", r"^hipGraphLaunch", "HIP graph replay"),
)
SHORT_KERNEL_THRESHOLDS_US: tuple[float, ...] = (10.0, 50.0)


@dataclass(frozen=True)
class LaunchStats:
    """Launch delays, launch CPU time, short kernels, and the launch-bound verdict with evidence."""

    kernels: int
    kernels_with_launch: int
    kernel_us: float
    delay_mean_us: float
    delay_p50_us: float
    delay_p90_us: float
    delay_p99_us: float
    delay_max_us: float
    outlier_threshold_us: float
    outlier_count: int
    outliers: pd.DataFrame  # rank, name, ts_us, dur_us, launch_name, launch_ts_us, launch_delay_us
    launch_calls: int
    launch_cpu_us: float
    launch_apis: pd.DataFrame  # launch_name, calls, total_us, mean_us
    short_kernels: pd.DataFrame  # threshold_us, count, total_us, count_share, time_share
    span_us: float
    gpu_busy_share: float
    empty_queue_share: float
    short_share_10us: float
    host_wait_us: float
    launch_bound: bool
    reasons: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.kernels < 0 or self.kernels_with_launch > self.kernels:
            raise ValueError("LaunchStats: inconsistent kernel counts")
        for name in ("gpu_busy_share", "empty_queue_share", "short_share_10us"):
            v = getattr(self, name)
            if not (np.isnan(v) or -1e-9 <= v <= 1 + 1e-9):
                raise ValueError(f"LaunchStats.{name} must be a share in [0, 1], got {v}")


def launch_delays(trace) -> pd.DataFrame:
    """Kernels with their launch call: `rank, device, stream, name, ts_us, dur_us, launch_name,
    launch_ts_us, launch_delay_us, empty_queue` (NaN / False when no launch call was matched).

    `empty_queue`: when the kernel was launched, everything enqueued before it on its stream had
    already finished, so the stream was waiting for this launch (HTA's queue length 0).
    """
    return _delays(stream_order(trace, with_launch=True))


def _delays(o: pd.DataFrame) -> pd.DataFrame:
    o = o[o["kind"] == "kernel"]
    launch = o["launch_ts_us"].to_numpy(float)
    prev = o["prev_reach_us"].to_numpy(float)
    empty = ~np.isnan(launch) & (np.isnan(prev) | (launch >= prev))
    out = o[["rank", "device", "stream", "name", "ts_us", "dur_us", "launch_name", "launch_ts_us"]].copy()
    out["launch_delay_us"] = out["ts_us"] - out["launch_ts_us"]
    out["empty_queue"] = empty
    return out.reset_index(drop=True)


def _gpu_span_busy(o: pd.DataFrame) -> tuple[float, float]:
    """Summed over (rank, device): span from first to last GPU activity, and busy (union) time."""
    key = o["rank"].to_numpy(np.int64) * 65536 + o["device"].to_numpy(np.int64)
    ts, end = o["ts_us"].to_numpy(float), o["end_us"].to_numpy(float)
    busy = iv.union_by_group(key, ts, end).total_by_group().sum()
    span = (pd.Series(end).groupby(key).max() - pd.Series(ts).groupby(key).min()).sum()
    return float(span), float(busy)


def _short_kernels(dur: np.ndarray, thresholds: tuple[float, ...]) -> pd.DataFrame:
    total_n, total_t = len(dur), float(dur.sum())
    rows = []
    for th in thresholds:
        sel = dur < th
        n, t = int(sel.sum()), float(dur[sel].sum())
        rows.append({"threshold_us": th, "count": n, "total_us": t,
                     "count_share": n / total_n if total_n else 0.0,
                     "time_share": t / total_t if total_t else 0.0})
    return pd.DataFrame(rows, columns=["threshold_us", "count", "total_us", "count_share", "time_share"])


@register_analysis("launch_stats", "Launch overhead and launch delay",
                   "Launch delay and outliers, CPU time in launch calls, short kernels; is the run launch-bound?")
def launch_stats(trace, k_mad: float = 5.0, max_outliers: int = 50, busy_threshold: float = 0.8,
                 empty_queue_threshold: float = 0.5, short_share_threshold: float = 0.5) -> LaunchStats:
    """Launch delay distribution and outliers, launch CPU time per API, short kernels, verdict."""
    if k_mad <= 0 or max_outliers < 0:
        raise ValueError("k_mad must be > 0 and max_outliers >= 0")
    o = stream_order(trace, with_launch=True)
    d = _delays(o)
    matched = d[d["launch_delay_us"].notna()]
    delay = matched["launch_delay_us"].to_numpy(float)
    q = np.percentile(delay, [50, 90, 99]) if len(delay) else np.full(3, np.nan)
    mad = float(np.median(np.abs(delay - q[0]))) if len(delay) else np.nan
    threshold = float(q[0] + max(k_mad * 1.4826 * mad, 1.0)) if len(delay) else np.nan
    out_rows = matched[matched["launch_delay_us"] > threshold]
    outliers = out_rows.nlargest(max_outliers, "launch_delay_us").drop(columns="empty_queue").reset_index(drop=True)
    outliers = outliers.astype({"name": object, "launch_name": object}).astype({"name": str, "launch_name": str})

    rt = trace.of_kind("cuda_runtime", "cuda_driver")
    rt = rt[names_match(rt["name"], LAUNCH_API_PATTERNS)]
    apis = (rt.groupby("name", observed=True).agg(calls=("dur_us", "size"), total_us=("dur_us", "sum"),
                                                  mean_us=("dur_us", "mean"))
            .sort_values("total_us", ascending=False).reset_index().rename(columns={"name": "launch_name"}))
    apis["launch_name"] = apis["launch_name"].astype(object).astype(str)

    dur = d["dur_us"].to_numpy(float)
    short = _short_kernels(dur, SHORT_KERNEL_THRESHOLDS_US)
    span, busy = _gpu_span_busy(o)
    busy_share = busy / span if span > 0 else float("nan")
    empty_queue_frac = float(matched["empty_queue"].mean()) if len(matched) else float("nan")
    short10 = float((dur < 10.0).mean()) if len(dur) else float("nan")
    gaps = _gaps(o, DEFAULT_KERNEL_WAIT_THRESHOLD_US)
    checks = (
        (busy_share < busy_threshold,
         f"GPU busy {_pct(busy_share)} of its span (launch-bound needs < {_pct(busy_threshold)})"),
        (empty_queue_frac >= empty_queue_threshold,
         f"{_pct(empty_queue_frac)} of kernels were launched into an empty stream queue "
         f"(needs >= {_pct(empty_queue_threshold)})"),
        (short10 >= short_share_threshold,
         f"{_pct(short10)} of kernels are shorter than 10 µs (needs >= {_pct(short_share_threshold)})"),
    )
    verdict = bool(len(dur)) and all(bool(ok) for ok, _ in checks)
    return LaunchStats(
        kernels=len(d), kernels_with_launch=len(matched), kernel_us=float(dur.sum()),
        delay_mean_us=float(delay.mean()) if len(delay) else np.nan,
        delay_p50_us=float(q[0]), delay_p90_us=float(q[1]), delay_p99_us=float(q[2]),
        delay_max_us=float(delay.max()) if len(delay) else np.nan,
        outlier_threshold_us=threshold, outlier_count=len(out_rows), outliers=outliers,
        launch_calls=int(apis["calls"].sum()), launch_cpu_us=float(apis["total_us"].sum()),
        launch_apis=apis, short_kernels=short, span_us=span, gpu_busy_share=busy_share,
        empty_queue_share=empty_queue_frac, short_share_10us=short10,
        host_wait_us=float(gaps["host_wait_us"].sum()), launch_bound=verdict,
        reasons=tuple(("yes: " if ok else "no: ") + text for ok, text in checks))


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{100.0 * x:.0f}%"
