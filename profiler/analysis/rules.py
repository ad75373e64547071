"""Rules: registered functions that turn analysis results into `Finding`s with estimated savings.

Each rule is `fn(trace, results) -> list[Finding]`, registered by name with `@register_rule`;
`run_rules` runs every registered rule, so adding a rule never edits a central if-chain. Their
thresholds are data (`THRESHOLDS`), overridable per call. Savings are estimates and each rule's
docstring states its estimate; percentages are of the summed step time of all ranks (the trace
span of a rank when it has no `ProfilerStep` markers).
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping

import numpy as np
import pandas as pd

from profiler.analysis import intervals as iv
from profiler.analysis import kernel_types as kt
from profiler.analysis.findings import Finding, Results, severity_for

__all__ = ["Finding", "Results", "THRESHOLDS", "run_rules", "step_total_us"]
from profiler.analysis.registry import RULES, register_rule

THRESHOLDS: Mapping[str, Mapping[str, float]] = MappingProxyType({
    "launch_bound": MappingProxyType({"min_pct": 1.0}),
    "low_gpu_utilization": MappingProxyType({"max_utilization": 0.6, "min_pct": 1.0}),
    "h2d_copy_in_step": MappingProxyType({"min_pct": 0.5}),
    "comm_not_overlapped": MappingProxyType({"max_overlap_pct": 70.0, "min_pct": 1.0}),
    "fusion_candidate": MappingProxyType({"min_kernels": 2, "min_share_of_kernel_time": 0.03}),
    "fp32_matmul_no_tensor_cores": MappingProxyType({"min_share_of_kernel_time": 0.05, "assumed_speedup": 2.0}),
    "stragglers": MappingProxyType({}),
    "sync_in_step": MappingProxyType({"min_calls": 1}),
})
SYNC_PATTERNS = (kt.NamePattern("sync", r"^(cuda|hip)(Stream|Device|Event)Synchronize$|^cu(Stream|Ctx|Event)Synchronize$"),)
MEMORY_BOUND_PATTERNS = (
    kt.NamePattern("elementwise", r"elementwise_kernel|elementwise", "ATen elementwise kernels"),
    kt.NamePattern("norm", r"layer_?norm|rms_?norm|group_?norm|batch_?norm|bn_fw|bn_bw|cunn_.*norm", "normalizations"),
    kt.NamePattern("softmax", r"softmax", "softmax kernels"),
    kt.NamePattern("activation", r"gelu|silu|swish|relu|tanh|sigmoid|dropout", "activations / dropout"),
)
# Already fused, or compute-bound kernels whose names carry an epilogue (gemm_relu, conv+bias).
NOT_MEMORY_BOUND_PATTERNS = (
    kt.NamePattern("fused", r"fused"),
    kt.NamePattern("gemm_conv", r"gemm|xmma|cutlass|nvjet|Cijk_|conv|winograd|wgrad|dgrad|fprop|implicit_gemm"),
)
GEMM_PATTERNS = (kt.NamePattern("gemm", r"gemm|xmma|cutlass|nvjet|cublas|Cijk_|matmul", "GEMM kernels"),)
MATMUL_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                        "aten::_addmm_activation", "aten::addbmm", "aten::addmm_", "aten::baddbmm_", "aten::addbmm_",
                        "aten::mv", "aten::addmv", "aten::_grouped_mm"})


def step_total_us(trace, results: Results | None = None) -> float:
    """Summed step time over ranks (whole-rank window where a rank has no steps)."""
    from profiler.analysis.breakdown import step_windows

    compute = lambda: float(step_windows(trace)["duration_us"].sum())  # noqa: E731
    return results.memo("step_total_us", compute) if results is not None else compute()


def _finding(rule: str, saving_us: float, step_us: float, message: str, **evidence: Any) -> Finding:
    saving_us = max(float(saving_us), 0.0)
    pct = 100.0 * saving_us / step_us if step_us > 0 else float("nan")
    return Finding(rule, severity_for(pct), message, saving_us, pct, evidence)


def _limits(rule: str, overrides: Mapping[str, Any] | None) -> dict[str, float]:
    return {**THRESHOLDS[rule], **dict((overrides or {}).get(rule, {}))}


def run_rules(trace, results: Results | None = None, thresholds: Mapping[str, Mapping[str, Any]] | None = None,
              names: list[str] | None = None) -> list[Finding]:
    """Run every registered rule (or `names`) and return findings, largest saving first."""
    results = results if results is not None else Results(trace)
    findings: list[Finding] = []
    for name in names or sorted(RULES):
        findings.extend(RULES[name].fn(trace, results, limits=_limits(name, thresholds)))
    return sorted(findings, key=lambda f: -f.est_saving_us)


@register_rule("launch_bound", "Many tiny kernels and a GPU waiting on the host: CUDA graphs or fusion")
def launch_bound(trace, results, limits) -> list[Finding]:
    """Fires on `launch_stats`' launch-bound verdict; saving = time the streams sat empty
    waiting for the host (an upper bound on what graphs or fusion can win)."""
    ls = results["launch_stats"]
    step_us = step_total_us(trace, results)
    if not ls.launch_bound:
        return []
    short = ls.short_kernels.set_index("threshold_us")
    n_short = int(short.loc[10.0, "count"]) if 10.0 in short.index else 0
    pct = 100.0 * ls.host_wait_us / step_us if step_us > 0 else float("nan")
    if not pct >= limits["min_pct"]:
        return []
    msg = (f"{pct:.0f}% of step time the GPU waits for launches while {n_short:,} of {ls.kernels:,} kernels "
           f"({ls.short_share_10us:.0%}) are shorter than 10 µs: launch-bound; use CUDA graphs or fusion")
    return [_finding("launch_bound", ls.host_wait_us, step_us, msg, short_kernels=n_short, kernels=ls.kernels,
                     host_wait_us=ls.host_wait_us, gpu_busy_share=ls.gpu_busy_share)]


@register_rule("low_gpu_utilization", "GPU idle for a large part of the steps")
def low_gpu_utilization(trace, results, limits) -> list[Finding]:
    """Per (rank, device) with utilization below the limit; saving = idle time of the steps
    (window minus busy), the most that overlapping host work could recover."""
    gm = results["gpu_metrics"]
    low = gm[gm["gpu_utilization"] < limits["max_utilization"]]
    if low.empty:
        return []
    step_us = step_total_us(trace, results)
    idle = float((low["window_us"] - low["busy_us"]).clip(lower=0).sum())
    pct = 100.0 * idle / step_us if step_us > 0 else float("nan")
    if not pct >= limits["min_pct"]:
        return []
    worst = low.sort_values("gpu_utilization").iloc[0]
    msg = (f"GPU utilization is {float(low['gpu_utilization'].mean()):.0%} on {len(low)} device(s) "
           f"(lowest {float(worst['gpu_utilization']):.0%} on rank {int(worst['rank'])}): the GPU idles "
           f"{idle:,.0f} µs ({pct:.0f}% of step time); overlap data loading and host work or raise the batch size")
    return [_finding("low_gpu_utilization", idle, step_us, msg, devices=len(low), idle_us=idle,
                     mean_utilization=float(low["gpu_utilization"].mean()))]


def _compute_union_by_rank(k: pd.DataFrame) -> dict[int, iv.Intervals]:
    """Union of computation-kernel intervals per rank, from the attribution's kernel frame."""
    k = k[k["kernel_type"] == kt.COMPUTATION]
    u = iv.union_by_group(k["rank"].to_numpy(np.int64), k["ts_us"], k["ts_us"] + k["dur_us"])
    return {int(r): iv.Intervals(u.starts[u.groups == r], u.ends[u.groups == r]) for r in np.unique(u.groups)}


@register_rule("h2d_copy_in_step", "Host-to-device copies inside the training/inference step")
def h2d_copy_in_step(trace, results, limits) -> list[Finding]:
    """HtoD memcpys inside steps (all of them when the trace has no steps); saving = their time
    not hidden behind computation kernels."""
    from profiler.analysis.memcpy import DIRECTION_PATTERNS

    k = results["attribution"].kernels
    c = k[k["kind"] == "gpu_memcpy"]
    c = c[kt.names_match(c["name"], tuple(p for p in DIRECTION_PATTERNS if p.label == "HtoD"))]
    if results.memo("has_steps", lambda: bool(trace.events["step"].notna().any())):
        c = c[c["step"].notna()]
    if c.empty:
        return []
    comp = results.memo("compute_union_by_rank", lambda: _compute_union_by_rank(k))
    exposed = 0.0
    for rank, g in c.groupby("rank"):  # one iteration per rank
        u = iv.union(g["ts_us"], g["ts_us"] + g["dur_us"])
        exposed += u.total_us - iv.intersection_length(u, comp.get(int(rank), iv.union([], [])))
    step_us = step_total_us(trace, results)
    pct = 100.0 * exposed / step_us if step_us > 0 else float("nan")
    if not pct >= limits["min_pct"]:
        return []
    mb = float(trace.events.loc[c["event_index"], "bytes"].astype("float64").sum()) / 1e6
    msg = (f"{len(c):,} host-to-device copies ({mb:,.1f} MB, {float(c['dur_us'].sum()):,.0f} µs) run inside steps, "
           f"{exposed:,.0f} µs ({pct:.1f}% of step time) not overlapped with compute; pin memory with "
           f"non_blocking=True, prefetch, or keep the data on the GPU")
    return [_finding("h2d_copy_in_step", exposed, step_us, msg, copies=len(c), megabytes=mb, exposed_us=exposed)]


@register_rule("comm_not_overlapped", "Communication that computation does not hide")
def comm_not_overlapped(trace, results, limits) -> list[Finding]:
    """Ranks whose comm/compute overlap is below the limit; saving = exposed communication time
    minus the time those ranks' collectives spent waiting for late ranks (that part belongs to
    the `stragglers` rule, so the two savings do not count it twice)."""
    from profiler.analysis.distributed import matched_collectives

    o = results["comm_comp_overlap"]
    o = o[(o["comm_busy_us"] > 0) & (o["overlap_pct"] < limits["max_overlap_pct"])]
    if o.empty:
        return []
    step_us = step_total_us(trace, results)
    exposed = float(o["exposed_comm_us"].sum())
    wait = 0.0
    if len(trace.ranks) > 1:
        m = results.memo("matched_collectives", lambda: matched_collectives(trace))
        wait = min(float(m.loc[m["rank"].isin(o["rank"]), "wait_us"].sum()), exposed)
    saving = exposed - wait
    pct = 100.0 * saving / step_us if step_us > 0 else float("nan")
    if not pct >= limits["min_pct"]:
        return []
    overlap = 100.0 * float(o["overlap_us"].sum()) / float(o["comm_busy_us"].sum())
    waiting = f", of which {wait:,.0f} µs waits for late ranks" if wait > 0 else ""
    msg = (f"Only {overlap:.0f}% of communication overlaps computation on {len(o)} rank(s): {exposed:,.0f} µs is "
           f"exposed{waiting}; {saving:,.0f} µs ({pct:.0f}% of step time) could hide behind compute "
           f"(DDP buckets, FSDP prefetch)")
    return [_finding("comm_not_overlapped", saving, step_us, msg, ranks=o["rank"].tolist(), overlap_pct=overlap,
                     exposed_comm_us=exposed, straggler_wait_us=wait)]


def _chains(k: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Runs of consecutive memory-bound kernels per (rank, stream): (one row per run with length,
    dur_us and an order-sensitive hash `sig` of its op sequence; per-kernel frame with its run)."""
    k = k.sort_values(["rank", "stream", "ts_us"], kind="stable")
    mb = kt.names_match(k["name"], MEMORY_BOUND_PATTERNS) & (k["kind"] == "kernel").to_numpy()
    mb &= ~kt.names_match(k["name"], NOT_MEMORY_BOUND_PATTERNS)
    lane = k["rank"].to_numpy(np.int64) * 1_000_003 + k["stream"].astype("Int64").fillna(-1).to_numpy(np.int64)
    new = np.r_[True, (lane[1:] != lane[:-1]) | (mb[1:] != mb[:-1])]
    run = np.cumsum(new) - 1
    label = k["op"].astype(str).where(k["op"].notna(), k["name"].astype(str))
    code = pd.factorize(label)[0].astype(np.uint64) + np.uint64(1)
    pos = pd.Series(run).groupby(run).cumcount().to_numpy().astype(np.uint64)
    with np.errstate(over="ignore"):
        h = code * np.power(np.uint64(1_000_000_007), pos + np.uint64(1))  # order-sensitive hash, wraps
    frame = pd.DataFrame({"run": run, "mb": mb, "h": h, "dur": k["dur_us"].to_numpy(float), "label": label.to_numpy()})
    runs = frame[frame["mb"]].groupby("run").agg(length=("dur", "size"), dur_us=("dur", "sum"), sig=("h", "sum"),
                                                 first=("label", "first"))
    return runs, frame


@register_rule("fusion_candidate", "A dominant chain of memory-bound elementwise/normalization kernels")
def fusion_candidate(trace, results, limits) -> list[Finding]:
    """The repeated chain (same op sequence) of >= min_kernels consecutive memory-bound kernels with
    the largest total time; saving = chain time x (1 - 1/length): a fused kernel reads and writes
    the tensor once instead of once per kernel (memory-bound, so time ~ bytes moved)."""
    k = results["attribution"].kernels
    if k.empty:
        return []
    runs, frame = _chains(k)
    runs = runs[runs["length"] >= limits["min_kernels"]]
    if runs.empty:
        return []
    by_sig = runs.groupby(["sig", "length"]).agg(count=("dur_us", "size"), dur_us=("dur_us", "sum"),
                                                  run=("dur_us", "idxmax")).reset_index()
    top = by_sig.sort_values("dur_us", ascending=False).iloc[0]
    kernel_us = float(k.loc[k["kind"] == "kernel", "dur_us"].sum())
    if kernel_us <= 0 or top["dur_us"] / kernel_us < limits["min_share_of_kernel_time"]:
        return []
    ops = frame.loc[frame["run"] == top["run"], "label"].tolist()
    length = int(top["length"])
    saving = float(top["dur_us"]) * (1 - 1 / length)
    step_us = step_total_us(trace, results)
    chain = " → ".join(ops[:8]) + (" → …" if len(ops) > 8 else "")
    runs = "once" if int(top["count"]) == 1 else f"{int(top['count']):,} times"
    msg = (f"A chain of {length} memory-bound kernels ({chain}) runs {runs} for "
           f"{float(top['dur_us']):,.0f} µs ({100 * top['dur_us'] / kernel_us:.0f}% of kernel time): fusion candidate, "
           f"est. {saving:,.0f} µs saved")
    return [_finding("fusion_candidate", saving, step_us, msg, ops=ops, length=length, occurrences=int(top["count"]),
                     chain_us=float(top["dur_us"]))]


@register_rule("fp32_matmul_no_tensor_cores", "Matmuls in fp32 on CUDA cores while no tensor-core kernel runs")
def fp32_matmul_no_tensor_cores(trace, results, limits) -> list[Finding]:
    """GEMM kernels (by name or launched by a matmul op) in fp32 while no kernel uses tensor cores;
    saving assumes TF32/bf16 makes them `assumed_speedup` x faster (TF32 peak is 8x fp32 on A100)."""
    k = results["attribution"].kernels
    k = k[k["kind"] == "kernel"]
    if k.empty or kt.is_tensor_core(k).any():
        return []
    ev = trace.events
    op_index = k["op_index"].to_numpy()
    has_op = op_index >= 0
    ops, inverse = np.unique(op_index[has_op].astype(np.int64), return_inverse=True)  # each op's types read once
    op_fp32 = ev["input_types"].reindex(ops).fillna("").str.contains('"float"', regex=False).to_numpy(bool)
    fp32_op = pd.Series(False, index=k.index)
    fp32_op.loc[k.index[has_op]] = op_fp32[inverse]
    by_name = kt.names_match(k["name"], GEMM_PATTERNS)
    by_op = k["op"].astype(str).isin(MATMUL_OPS).to_numpy() | k["top_op"].astype(str).isin(MATMUL_OPS).to_numpy()
    fp32_name = kt.names_match(k["name"], (kt.NamePattern("fp32", r"sgemm|f32|fp32|float"),))
    gemm = k[(by_name | by_op) & (fp32_op.to_numpy() | fp32_name)]
    kernel_us = float(k["dur_us"].sum())
    gemm_us = float(gemm["dur_us"].sum())
    if gemm.empty or kernel_us <= 0 or gemm_us / kernel_us < limits["min_share_of_kernel_time"]:
        return []
    saving = gemm_us * (1 - 1 / limits["assumed_speedup"])
    step_us = step_total_us(trace, results)
    msg = (f"{len(gemm):,} fp32 matmul kernels take {gemm_us:,.0f} µs ({100 * gemm_us / kernel_us:.0f}% of kernel time) "
           f"and none runs on tensor cores: enable TF32 (torch.set_float32_matmul_precision('high')) or autocast to bf16")
    return [_finding("fp32_matmul_no_tensor_cores", saving, step_us, msg, gemm_kernels=len(gemm), gemm_us=gemm_us,
                     assumed_speedup=limits["assumed_speedup"])]


@register_rule("stragglers", "Ranks out of line with the others")
def stragglers_rule(trace, results, limits) -> list[Finding]:
    """One finding per straggler rank; saving = its excess over the other ranks' median, per step
    (step time, compute time or collective lateness, the largest that fired) x its steps."""
    if len(trace.ranks) < 2:
        return []
    s = results["stragglers"]
    out = []
    step_us = step_total_us(trace, results)
    for _, r in s[s["straggler"]].iterrows():  # one iteration per flagged rank
        others = s[s["rank"] != r["rank"]]
        excess = {c: float(r[c] - others[c].median()) for c in ("step_us", "compute_us", "coll_late_us")
                  if pd.notna(r[c]) and pd.notna(others[c].median())}
        metric, ex = max(excess.items(), key=lambda kv: kv[1]) if excess else ("step_us", 0.0)
        saving = max(ex, 0.0) * max(int(r["n_steps"]), 1)
        msg = (f"Rank {int(r['rank'])} is a straggler ({r['reason']}): {metric.removesuffix('_us').replace('_', ' ')} "
               f"{float(r[metric]):,.0f} µs vs a median {float(others[metric].median()):,.0f} µs on the other ranks; "
               f"balance the work, or look at that rank's machine (clocks, throttling, data loading)")
        out.append(_finding("stragglers", saving, step_us, msg, rank=int(r["rank"]), metric=metric, excess_us=ex))
    return out


@register_rule("sync_in_step", "Host-device synchronisations inside steps")
def sync_in_step(trace, results, limits) -> list[Finding]:
    """cudaStreamSynchronize / cudaDeviceSynchronize / hipDeviceSynchronize ... (and `cuda_sync`
    rows when no host call is recorded) inside steps; saving = host time blocked in them."""
    ev = trace.events[["kind", "name", "step", "dur_us"]]
    has_steps = results.memo("has_steps", lambda: bool(ev["step"].notna().any()))
    host = ev[ev["kind"].isin(("cuda_runtime", "cuda_driver"))]
    host = host[kt.names_match(host["name"], SYNC_PATTERNS)]
    rows = host if len(host) else ev[ev["kind"] == "cuda_sync"]
    if has_steps:
        rows = rows[rows["step"].notna()]
    if len(rows) < limits["min_calls"]:
        return []
    blocked = float(rows["dur_us"].sum())
    step_us = step_total_us(trace, results)
    pct = 100.0 * blocked / step_us if step_us > 0 else float("nan")
    top = rows["name"].astype(str).value_counts().head(3)
    calls = ", ".join(f"{n} ×{c}" for n, c in top.items())
    msg = (f"{len(rows):,} synchronisations inside steps ({calls}) block the host for {blocked:,.0f} µs "
           f"({pct:.1f}% of step time); avoid .item()/.cpu()/printing tensors in the loop")
    return [_finding("sync_in_step", blocked, step_us, msg, calls=len(rows), blocked_us=blocked)]
