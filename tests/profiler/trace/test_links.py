"""Steps and flow links: a synthetic trace with known answers, and real traces against plain Python."""
from __future__ import annotations

import bisect
import json
import re
from collections import Counter

import pytest

from profiler.trace import load_trace
from tests.profiler.trace.conftest import CATEGORY_KIND, _int_id, loaded, raw_truth, trace_named

DEVICE_SIDE = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"}
FLOW_TARGETS = {"cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset", "cuda_sync"}


def _x(cat, name, ts, dur, pid=1, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": args}


def test_synthetic_steps_and_flows(tmp_path):
    events = [
        _x("user_annotation", "ProfilerStep#3", 0, 100),
        _x("cpu_op", "aten::mm", 10, 30, **{"External id": 7}),
        _x("cuda_runtime", "cudaLaunchKernel", 20, 5, correlation=5, **{"External id": 7}),
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 5, "pid": 1, "tid": 1, "ts": 20},
        _x("kernel", "gemm", 150, 10, pid=0, tid=7, device=0, stream=7, correlation=5),  # after the CPU span
        {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 5, "pid": 0, "tid": 7, "ts": 150, "bp": "e"},
        _x("gpu_user_annotation", "ProfilerStep#4", 250, 150, pid=0, tid=7),
        _x("kernel", "orphan", 300, 10, pid=0, tid=7, device=0, stream=7, correlation=99),  # no launch row
        _x("cpu_op", "aten::add", 500, 1),  # outside every step
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    ev = load_trace(path).events.set_index("name")
    assert ev.loc["aten::mm", "step"] == 3 and ev.loc["cudaLaunchKernel", "step"] == 3
    assert ev.loc["gemm", "step"] == 3  # via its launch's correlation, not by time
    assert ev.loc["orphan", "step"] == 4  # falls back to the GPU-side ProfilerStep span
    assert ev["step"].isna()["aten::add"]
    assert ev.loc["cudaLaunchKernel", "flow_id"] == 5 and ev.loc["gemm", "flow_id"] == 5
    assert ev["flow_id"].isna()["aten::mm"] and ev["flow_id"].isna()["orphan"]


def _raw_steps(kept):
    def spans_of(kinds):
        out = []
        for e in kept:
            m = re.fullmatch(r"ProfilerStep#(\d+)", e["name"])
            if m and CATEGORY_KIND[e["cat"]] in kinds:
                out.append((e["ts"], e["ts"] + e["dur"], int(m.group(1))))
        return sorted(out)

    def contain(ts, spans):
        i = bisect.bisect_right([s for s, _, _ in spans], ts) - 1
        return spans[i][2] if i >= 0 and ts < spans[i][1] else None

    cpu_spans = spans_of({"user_annotation", "cpu_op"})
    gpu_spans = spans_of({"gpu_user_annotation"})
    steps, launch_step = [], {}
    for e in kept:
        if CATEGORY_KIND[e["cat"]] not in DEVICE_SIDE:
            s = contain(e["ts"], cpu_spans)
            if CATEGORY_KIND[e["cat"]] in ("cuda_runtime", "cuda_driver") and s is not None:
                launch_step.setdefault(e["args"].get("correlation"), s)
    for e in kept:
        if CATEGORY_KIND[e["cat"]] in DEVICE_SIDE:
            s = launch_step.get(e["args"].get("correlation"))
            steps.append(s if s is not None else contain(e["ts"], gpu_spans))
        else:
            steps.append(contain(e["ts"], cpu_spans))
    return Counter(steps)


@pytest.mark.parametrize("prefix", ["hta_mi250", "tracelens_h100_bert_small", "hta_a100_rank0of2_nccl",
                                    "kineto_v100_resnet50"])
def test_steps_match_plain_python(prefix):
    path = trace_named(prefix)
    tr, truth = loaded(path), raw_truth(path)
    got = Counter(None if s is None else int(s) for s in tr.events["step"].astype(object).where(
        tr.events["step"].notna(), None))
    assert got == _raw_steps(truth["kept"])
    assert len(got) > 1


@pytest.mark.parametrize("prefix", ["hta_a100_80gb", "hta_v100_rank1of2", "tracelens_amd_vllm", "hta_a100_alexnet"])
def test_flows_match_plain_python(prefix):
    path = trace_named(prefix)
    tr, truth = loaded(path), raw_truth(path)
    by_key: dict = {}
    for i, e in enumerate(truth["kept"]):
        if CATEGORY_KIND[e["cat"]] in FLOW_TARGETS:
            by_key.setdefault((_int_id(e["pid"]), _int_id(e["tid"]), e["ts"]), []).append(i)
    taken: dict[int, int] = {}
    unbound = 0
    for f in truth["doc"]["traceEvents"]:
        if f.get("ph") in ("s", "f") and f.get("cat") in ("ac2g", "async_cpu_to_gpu", "async"):
            cands = by_key.get((_int_id(f["pid"]), _int_id(f["tid"]), f["ts"]))
            if not cands:
                unbound += 1
            elif cands[0] not in taken:
                taken[cands[0]] = f["id"]
    want = Counter((CATEGORY_KIND[truth["kept"][i]["cat"]], fid) for i, fid in taken.items())
    ev = tr.events[tr.events["flow_id"].notna()]
    got = Counter(zip(ev["kind"].astype(str), ev["flow_id"].astype(int)))
    assert got == want
    assert tr.meta["unbound_flows"] >= unbound
