"""The distributed analyses on a real two-rank CPU DDP pair (gloo; tests/data/ddp_cpu/README.md),
checked against numbers recomputed here from the raw JSON with plain Python."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from profiler.analysis import cpu_comm, distributed
from profiler.trace.ingest import load_trace
from tests.profiler.analysis.raw_json import merged_spans, overlap_us

DDP = Path(__file__).resolve().parents[2] / "data" / "ddp_cpu"
FILES = [DDP / f"mlp_tiny_train_rank{r}.pt.trace.json.gz" for r in (0, 1)]


def _raw(rank: int) -> list[dict]:
    with gzip.open(FILES[rank], "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def _subtract(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out = []
    for s, e in a:
        pieces = [(s, e)]
        for bs, be in b:
            pieces = [p for ps, pe in pieces for p in ((ps, min(pe, bs)), (max(ps, be), pe)) if p[1] > p[0]]
        out += pieces
    return out


def _expected(rank: int) -> dict:
    """Collective spans, compute union and their overlap for one rank, from the raw events."""
    ev = _raw(rank)
    coll = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("gloo:")]
    tids = {e["tid"] for e in coll}
    ops = [e for e in ev if e.get("cat") == "cpu_op" and e["tid"] not in tids]
    work = merged_spans([(e["ts"], e["ts"] + e["dur"]) for e in ops if not e["name"].startswith("c10d::")])
    waits = merged_spans([(e["ts"], e["ts"] + e["dur"]) for e in ops if e["name"].startswith("c10d::")])
    compute = merged_spans(_subtract(work, waits))
    comm = merged_spans([(e["ts"], e["ts"] + e["dur"]) for e in coll])
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#")]
    return {"n": len(coll), "comm_sum": sum(e["dur"] for e in coll), "comm_busy": sum(e - s for s, e in comm),
            "compute": sum(e - s for s, e in compute), "overlap": overlap_us(comm, compute), "steps": len(steps)}


@pytest.fixture(scope="module")
def trace():
    return load_trace([str(f) for f in FILES])


def test_collectives_are_the_gloo_spans(trace) -> None:
    c = distributed.collectives(trace)
    assert c["rank"].tolist() == [0, 1] and set(c["collective"]) == {"all_reduce"}
    for rank in (0, 1):
        row = c[c["rank"] == rank].iloc[0]
        want = _expected(rank)
        assert row["count"] == want["n"] == 3  # DDP's one gradient bucket, once per profiled step
        assert row["total_us"] == pytest.approx(want["comm_sum"], abs=1e-3)


def test_overlap_of_cpu_collectives_with_cpu_compute(trace) -> None:
    o = distributed.comm_comp_overlap(trace).set_index("rank")
    for rank in (0, 1):
        want = _expected(rank)
        got = o.loc[rank]
        assert got["comm_kernels"] == want["n"]
        assert got["comm_busy_us"] == pytest.approx(want["comm_busy"], abs=1e-3)
        assert got["compute_busy_us"] == pytest.approx(want["compute"], abs=1e-2)
        assert got["overlap_us"] == pytest.approx(want["overlap"], abs=1e-2)
        assert got["exposed_comm_us"] == pytest.approx(want["comm_busy"] - want["overlap"], abs=1e-2)
        assert 0 < got["compute_busy_us"] < 0.5 * got["comm_busy_us"]  # tiny MLP: gloo on 2 vCPUs dominates


def test_stragglers_match_collectives_and_compute_across_ranks(trace) -> None:
    s = distributed.stragglers(trace).set_index("rank")
    for rank in (0, 1):
        want = _expected(rank)
        assert s.loc[rank, "n_collectives"] == want["n"] and s.loc[rank, "n_steps"] == want["steps"] == 3
        assert s.loc[rank, "compute_us"] == pytest.approx(want["compute"] / want["steps"], abs=1e-2)
    # Two ranks, matched collective by collective: one rank's lateness is the other's wait.
    assert s.loc[1, "coll_late_us"] == pytest.approx(s.loc[0, "coll_wait_us"])
    assert not s["straggler"].any()  # same program on both ranks, compute within 5%


def test_gpu_ranks_do_not_count_cpu_spans(trace) -> None:
    """A gloo span on a rank that has GPU communication kernels is not communication of its own."""
    import pandas as pd

    ev = trace.events
    kernel = ev.iloc[[0]].assign(kind="kernel", name="ncclDevKernel_AllReduce_Sum_f32_RING_LL", rank=0)
    with_gpu = type(trace)(events=pd.concat([ev, kernel], ignore_index=True), meta=trace.meta,
                           memory=trace.memory, counters=trace.counters)
    mask = cpu_comm.collective_span_mask(with_gpu.events)
    assert not mask[(with_gpu.events["rank"] == 0).to_numpy()].any()
    assert mask[(with_gpu.events["rank"] == 1).to_numpy()].sum() == _expected(1)["n"]


def _length(spans) -> float:
    return sum(e - s for s, e in spans)


def _clip(spans, lo: float, hi: float) -> list[tuple[float, float]]:
    return [(max(s, lo), min(e, hi)) for s, e in spans if min(e, hi) > max(s, lo)]


def test_step_breakdown_counts_gloo_communication(trace) -> None:
    """Per rank and step, recomputed from the raw events: communication = the c10d:: ops and the
    ops of the gloo worker thread, plus the gloo spans where no other CPU op runs; cpu_only = the
    other CPU ops; the breakdown's categories still sum to the step."""
    from profiler.analysis.breakdown import step_breakdown

    got = step_breakdown(trace).set_index(["rank", "step"])
    for rank in (0, 1):
        ev = _raw(rank)
        spans = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("gloo:")]
        tids = {e["tid"] for e in spans}
        ops = [e for e in ev if e.get("cat") == "cpu_op"]
        comm_ops = merged_spans([(e["ts"], e["ts"] + e["dur"]) for e in ops
                                 if e["name"].startswith("c10d::") or e["tid"] in tids])
        cpu = merged_spans(_subtract(merged_spans([(e["ts"], e["ts"] + e["dur"]) for e in ops]), comm_ops))
        hidden = merged_spans(comm_ops + cpu)
        coll = merged_spans(_subtract(merged_spans([(e["ts"], e["ts"] + e["dur"]) for e in spans]), hidden))
        steps = sorted((e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1])) for e in ev
                       if e["name"].startswith("ProfilerStep#"))
        prev_end = float("-inf")
        for start, end, step in steps:  # TensorBoard's windows: not before the previous step's end
            lo = max(start, prev_end)
            prev_end = max(prev_end, end)
            row = got.loc[(rank, step)]
            want_comm = _length(_clip(comm_ops, lo, end)) + _length(_clip(coll, lo, end))
            assert row["duration_us"] == pytest.approx(end - lo, abs=1e-3)
            assert row["communication_us"] == pytest.approx(want_comm, abs=1e-2), (rank, step)
            assert row["cpu_only_us"] == pytest.approx(_length(_clip(cpu, lo, end)), abs=1e-2), (rank, step)
            cats = [c for c in row.index if c.endswith("_us") and c not in ("start_us", "end_us", "duration_us")]
            assert sum(row[c] for c in cats) == pytest.approx(row["duration_us"], abs=1e-2)
            assert row["communication_us"] > 0.4 * row["duration_us"]  # gloo on 2 vCPUs dominates a tiny MLP
