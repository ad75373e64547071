"""Distributed analyses: known overlap %, a planted straggler (with clock skew), collective sizes."""
from __future__ import annotations

import math

import pytest

from profiler.analysis import distributed as dist
from tests.profiler.analysis.raw_json import merged_spans, overlap_us
from tests.profiler.analysis.synth import REAL_TRACES, SynthTrace, load, raw_events, real_trace

NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
ARGS = {"Collective name": "allreduce", "In msg nelems": 1000, "Out msg nelems": 1000, "dtype": "Float",
        "Group size": 4, "Process Group Name": "0"}


def test_overlap_percent_is_known(tmp_path):
    t = SynthTrace()
    t.launch("aten::mm", "gemm_a", cpu_ts=0, kernel_ts=0, dur=100, stream=7)
    t.launch("aten::mm", "gemm_b", cpu_ts=20, kernel_ts=150, dur=100, stream=7)
    t.launch("nccl:all_reduce", NCCL, cpu_ts=40, kernel_ts=50, dur=150, stream=20, **ARGS)
    t.launch("aten::copy_", "multimem_all_reduce_kernel", cpu_ts=60, kernel_ts=300, dur=50, stream=21)
    o = dist.comm_comp_overlap(load(t, tmp_path)).iloc[0]
    # comm busy = [50,200) U [300,350) = 200; overlapped by compute = [50,100) U [150,200) = 100
    assert o["comm_busy_us"] == pytest.approx(200)
    assert o["overlap_us"] == pytest.approx(100)
    assert o["overlap_pct"] == pytest.approx(50.0)
    assert o["exposed_comm_us"] == pytest.approx(100)
    assert o["comm_kernels"] == 2


def straggler_ranks(n_ranks: int, slow: int, skew_us: float = 0.0) -> list[SynthTrace]:
    """Each step: compute, then an all-reduce all ranks leave together. Rank `slow` computes
    200 µs longer, so it arrives 200 µs late and the others wait. Its clock is off by `skew_us`."""
    out = []
    for r in range(n_ranks):
        t = SynthTrace(rank=r, world_size=n_ranks, base_us=1_700_000_000_000.0 + (skew_us if r == slow else 0.0))
        for s in range(4):
            t0 = 1000.0 * s
            t.step(s + 1, t0, 1000)
            comp = 800 if r == slow else 600
            t.launch("aten::mm", "gemm", cpu_ts=t0 + 1, kernel_ts=t0 + 5, dur=comp - 5)
            t.launch("nccl:all_reduce", NCCL, cpu_ts=t0 + 20, kernel_ts=t0 + comp, dur=900 - comp, stream=20, **ARGS)
        out.append(t)
    return out


@pytest.mark.parametrize("n_ranks,skew", [(2, 0.0), (4, 0.0), (4, 5000.0)])
def test_planted_straggler_is_found(tmp_path, n_ranks, skew):
    trace = load(straggler_ranks(n_ranks, slow=1, skew_us=skew), tmp_path)
    s = dist.stragglers(trace).set_index("rank")
    assert s["straggler"].tolist() == [r == 1 for r in range(n_ranks)]
    assert "late at collectives" in s.loc[1, "reason"] and "compute" in s.loc[1, "reason"]
    assert s.loc[1, "coll_late_us"] == pytest.approx(200, abs=1e-3)
    assert s.loc[0, "coll_wait_us"] == pytest.approx(200, abs=1e-3)
    assert s.loc[1, "clock_offset_us"] == pytest.approx(skew, abs=1e-3)
    m = dist.matched_collectives(trace)
    assert m.groupby("rank").size().tolist() == [4] * n_ranks


def test_identical_ranks_have_no_straggler(tmp_path):
    ranks = straggler_ranks(3, slow=-1)
    s = dist.stragglers(load(ranks, tmp_path))
    assert not s["straggler"].any()


def test_collective_sizes_from_args(tmp_path):
    trace = load(straggler_ranks(2, slow=0), tmp_path)
    c = dist.collectives(trace)
    assert set(c["collective"]) == {"all_reduce"}
    assert (c["in_bytes"] == 4000).all() and (c["count"] == 4).all()
    assert c["algbw_gb_s"].notna().all()


def test_collective_sizes_match_raw_nccl_args():
    name = "hta_a100_rank0of2_nccl_data.json.gz"
    size = {"Float": 4, "Long": 8}
    truth: dict[tuple[str, float], int] = {}
    for e in raw_events(name):
        a = e.get("args") or {}
        if e.get("cat") == "kernel" and "In msg nelems" in a:
            key = (a["dtype"], a["In msg nelems"] * size[a["dtype"]])
            truth[key] = truth.get(key, 0) + 1
    c = dist.collectives(real_trace(name))
    ours = {(r.comm_dtype, float(r.in_bytes)): int(r.count) for r in c.itertuples()}
    assert ours == {k: v for k, v in truth.items()}


@pytest.mark.parametrize("name", REAL_TRACES)
def test_distributed_runs_on_every_real_trace(name):
    tr = real_trace(name)
    o = dist.comm_comp_overlap(tr)
    assert len(o) == len(tr.ranks)
    pct = o["overlap_pct"].dropna()
    assert ((pct >= 0) & (pct <= 100 + 1e-9)).all()
    dist.collectives(tr)
    s = dist.stragglers(tr)
    assert not s["straggler"].any()  # one rank cannot straggle against itself
    assert all(math.isnan(v) or v >= 0 for v in o["exposed_comm_us"])


def test_overlap_matches_plain_python_on_the_raw_nccl_trace():
    """Overlap % and exposed communication recomputed from the raw JSON: union of NCCL kernels,
    union of the other kernels, their intersection (a quadratic loop: fine for a few thousand)."""
    name = "hta_a100_rank0of2_nccl_data.json.gz"
    kernels = [e for e in raw_events(name) if e.get("cat") == "kernel"]
    comm = merged_spans([(e["ts"], e["ts"] + e["dur"]) for e in kernels if e["name"].startswith("ncclKernel")])
    comp = merged_spans([(e["ts"], e["ts"] + e["dur"]) for e in kernels if not e["name"].startswith("ncclKernel")])
    inter = overlap_us(comm, comp)
    comm_us = sum(e - s for s, e in comm)
    o = dist.comm_comp_overlap(real_trace(name)).iloc[0]
    assert o["comm_busy_us"] == pytest.approx(comm_us, abs=1e-3)
    assert o["overlap_us"] == pytest.approx(inter, abs=0.05)
    assert o["overlap_pct"] == pytest.approx(100 * inter / comm_us, abs=1e-4)
    assert o["exposed_comm_us"] == pytest.approx(comm_us - inter, abs=0.05)
