"""Attribution: synthetic traces with known answers, and real traces against raw-JSON recomputation."""
from __future__ import annotations

import bisect

import numpy as np
import pytest

from profiler.analysis.attribution import attribution
from tests.profiler.analysis.raw_json import raw_events
from tests.profiler.analysis.synth import HOST_PID, HOST_TID, REAL_TRACES, SynthTrace, load, real_trace


def module(t: SynthTrace, name: str, ts: float, dur: float, tid: int = HOST_TID) -> None:
    t._x("python_function", f"nn.Module: {name}", ts, dur, HOST_PID, tid, {"Python id": 1, "Python module id": 0})


def nested_scenario() -> SynthTrace:
    """Block_0 > aten::linear > aten::addmm; addmm launches gemm (External id); linear itself
    launches bias_add (no External id: containment); a graph replay; a Triton driver launch."""
    t = SynthTrace()
    t.step(1, 0, 400)
    module(t, "Model_0", 1, 390)
    module(t, "Block_0", 2, 120)
    t.cpu_op("aten::linear", 5, 60, ext=t.new_ext(), **{"Input Dims": [[4, 8], [8, 8]], "Input type": ["float", "float"]})
    ext = t.new_ext()
    t.cpu_op("aten::addmm", 10, 20, ext=ext)
    c1 = t.new_corr()
    t.runtime("cudaLaunchKernel", 12, 4, corr=c1, ext=ext)
    t.kernel("gemm", 100, 20, corr=c1, ext=ext)
    c2 = t.new_corr()
    t.runtime("cudaLaunchKernel", 40, 3, corr=c2)
    t.kernel("bias_add", 125, 5, corr=c2)
    # CUDA graph: three kernels share one cudaGraphLaunch correlation, no External id.
    t.cpu_op("CUDAGraph::replay", 150, 40, ext=t.new_ext())
    c3 = t.new_corr()
    t.runtime("cudaGraphLaunch", 160, 10, corr=c3)
    for i, ts in enumerate((200, 210, 220)):
        t.kernel(f"graph_k{i}", ts, 6, corr=c3)
    # Triton via the driver API inside a compiled region, under module Head_0.
    module(t, "Head_0", 250, 100)
    ext4 = t.new_ext()
    t.cpu_op("Torch-Compiled Region: 0/0", 260, 50, ext=ext4)
    c4 = t.new_corr()
    t.runtime("cuLaunchKernel", 270, 5, corr=c4, ext=ext4, cat="cuda_driver")
    t.kernel("triton_poi_fused_add_0", 300, 7, corr=c4, ext=ext4)
    # A kernel whose launch happened before the trace: no link at all.
    t.kernel("orphan", 390, 2, corr=99999)
    return t


@pytest.fixture(scope="module")
def nested(tmp_path_factory):
    return attribution(load(nested_scenario(), tmp_path_factory.mktemp("attr")))


def by_name(a, name):
    rows = a.kernels[a.kernels["name"].astype(str) == name]
    assert len(rows) >= 1, name
    return rows.iloc[0]


def test_nested_op_kernel_goes_to_innermost_op_and_its_parents(nested):
    k = by_name(nested, "gemm")
    assert (k["op"], k["top_op"], k["module"], k["link"]) == ("aten::addmm", "aten::linear", "Block_0", "external_id")
    assert k["module_path"] == "Model_0 > Block_0" and k["module_via"] == "scope"
    assert k["scope_path"] == "Model_0 > Block_0 > aten::linear > aten::addmm"
    b = by_name(nested, "bias_add")
    assert (b["op"], b["link"], b["launch_name"]) == ("aten::linear", "containment", "cudaLaunchKernel")
    ops = nested.ops.set_index("name")
    assert ops.loc["aten::addmm", "device_self_us"] == pytest.approx(20)
    assert ops.loc["aten::linear", "device_self_us"] == pytest.approx(5)
    assert ops.loc["aten::linear", "device_total_us"] == pytest.approx(25)
    assert ops.loc["aten::linear", "cpu_self_us"] == pytest.approx(60 - 20)
    dims = nested.ops_by_dims.set_index("name")
    assert dims.loc["aten::linear", "input_dims"] == "[[4,8],[8,8]]"


def test_cuda_graph_and_driver_launches_are_attributed(nested):
    g = nested.kernels[nested.kernels["name"].astype(str).str.startswith("graph_k")]
    assert len(g) == 3
    assert set(g["op"].astype(str)) == {"CUDAGraph::replay"}
    assert set(g["launch_name"].astype(str)) == {"cudaGraphLaunch"}
    assert set(g["module"].astype(str)) == {"Model_0"}
    tr = by_name(nested, "triton_poi_fused_add_0")
    assert (tr["op"], tr["launch_name"], tr["module"]) == ("Torch-Compiled Region: 0/0", "cuLaunchKernel", "Head_0")
    orphan = by_name(nested, "orphan")
    assert orphan["link"] == "none" and orphan["op"] is None or str(orphan["op"]) == "nan"


def test_tree_self_and_total(nested):
    tree = nested.tree.set_index("path")
    assert tree.loc["Model_0", "total_device_us"] == pytest.approx(20 + 5 + 18 + 7)
    assert tree.loc["Model_0 > Block_0", "total_device_us"] == pytest.approx(25)
    assert tree.loc["Model_0 > Block_0 > aten::linear", "self_device_us"] == pytest.approx(5)
    assert tree.loc["Model_0 > Block_0 > aten::linear > aten::addmm > gemm", "node_kind"] == "kernel"
    roots = nested.tree[nested.tree["depth"] == 0]
    assert roots["total_device_us"].sum() == pytest.approx(nested.kernels["dur_us"].sum())


def test_wrong_external_id_is_rejected_for_containment(tmp_path):
    t = SynthTrace()
    other_ext = t.new_ext()
    t.cpu_op("aten::unrelated", 0, 5, ext=other_ext, tid=HOST_TID + 1)  # another thread
    t.cpu_op("aten::mul", 10, 10, ext=t.new_ext())
    c = t.new_corr()
    t.runtime("cudaLaunchKernel", 12, 2, corr=c, ext=other_ext)
    t.kernel("mul_kernel", 20, 3, corr=c, ext=other_ext)
    k = attribution(load(t, tmp_path)).kernels.iloc[0]
    assert (k["op"], k["link"]) == ("aten::mul", "containment")


def test_kernels_without_any_cpu_scope_are_unattributed(tmp_path):
    """A trace with GPU rows but no op, annotation or module scope at all (a GPU-only capture, or
    one whose CPU side was cut away; found by tests/profiler/trace/fuzz_ingest.py)."""
    t = SynthTrace()
    c = t.new_corr()
    t.runtime("cudaLaunchKernel", 0, 2, corr=c)
    t.kernel("k0", 5, 3, corr=c)
    t.kernel("k1", 9, 4, corr=t.new_corr())
    res = attribution(load(t, tmp_path))
    assert len(res.kernels) == 2 and res.kernels["op"].isna().all() and res.kernels["op_input_dims"].isna().all()
    assert list(res.kernels["link"]) == ["none", "none"] and len(res.ops) == 0


def test_external_ids_past_2_to_the_53_stay_exact(tmp_path):
    """Ids 2^60 and 2^60 + 1 are one float64: they must stay two ids (with a scope that has no id,
    the column used to go through float64 and the cast back raised; found by fuzz_ingest.py)."""
    t = SynthTrace()
    t.cpu_op("aten::outer", 0, 100)  # no External id
    for i, (op, kernel) in enumerate((("aten::a", "ka"), ("aten::b", "kb"))):
        ext, c = 2**60 + i, t.new_corr()
        t.cpu_op(op, 10 + 40 * i, 30, ext=ext)
        t.runtime("cudaLaunchKernel", 12 + 40 * i, 2, corr=c, ext=ext)
        t.kernel(kernel, 20 + 40 * i, 3, corr=c, ext=ext)
    k = attribution(load(t, tmp_path)).kernels.set_index("name")
    assert (k.loc["ka", "op"], k.loc["kb", "op"]) == ("aten::a", "aten::b")
    assert set(k["link"]) == {"external_id"}


@pytest.mark.parametrize("name", REAL_TRACES)
def test_every_real_trace_attributes_consistently(name):
    tr = real_trace(name)
    a = attribution(tr)
    gpu = tr.events[tr.events["kind"].isin(("kernel", "gpu_memcpy", "gpu_memset"))]
    assert len(a.kernels) == len(gpu)
    assert a.kernels["dur_us"].sum() == pytest.approx(gpu["dur_us"].sum())
    roots = a.tree[a.tree["depth"] == 0]
    assert roots["total_device_us"].sum() == pytest.approx(gpu["dur_us"].sum())
    assert (a.tree["self_device_us"] <= a.tree["total_device_us"] + 1e-6).all()
    linked = a.kernels[a.kernels["link"] != "none"]
    assert np.isfinite(linked["launch_ts_us"]).all() or (linked["link"] == "external_id").any()


RAW_OP_TRACES = ["tracelens_h100_bert_small.json.gz", "hta_mi250_minitoy_train_rocm6.2.json.gz",
                 "kineto_v100_resnet50_nw4_worker0.1623212756351.pt.trace.json.gz",
                 "tracelens_amd_vllm_decode_hipgraph_replay.json.gz"]


@pytest.mark.parametrize("name", RAW_OP_TRACES)
def test_op_table_matches_raw_json(name):
    """cpu_op table against the raw JSON: calls and CPU time per op name (2021 format included)."""
    a = attribution(real_trace(name))
    raw = [e for e in raw_events(name) if e.get("cat") in ("cpu_op", "Operator")
           and not str(e["name"]).startswith("ProfilerStep#")]
    calls: dict[str, int] = {}
    cpu: dict[str, float] = {}
    for e in raw:
        calls[e["name"]] = calls.get(e["name"], 0) + 1
        cpu[e["name"]] = cpu.get(e["name"], 0.0) + float(e.get("dur", 0))
    ops = a.ops.set_index("name")
    assert dict(ops["calls"]) == calls
    for n in list(calls)[:50]:
        assert ops.loc[n, "cpu_total_us"] == pytest.approx(cpu[n], rel=1e-6, abs=1e-3)


def _exact_self_us(name: str) -> dict[str, float]:
    """CPU self time per op name from the raw JSON in integer nanoseconds (Decimal parse, so the
    epoch-µs ns trace keeps its digits): per thread, scopes sorted by (start, -end) nest by a
    stack; self = span - the spans of the direct children (ops, annotations, nn.Module scopes)."""
    scopes: dict[tuple, list] = {}
    for e in raw_events(name, exact=True):
        cat, nm = e.get("cat"), str(e.get("name", ""))
        if nm.startswith("ProfilerStep#"):
            continue
        if cat in ("cpu_op", "Operator", "user_annotation") or (cat == "python_function" and nm.startswith("nn.Module: ")):
            start = int(e["ts"] * 1000)  # Decimal or int: exact
            op = nm if cat in ("cpu_op", "Operator") else None
            scopes.setdefault((e.get("pid"), e.get("tid")), []).append((start, start + int(e["dur"] * 1000), op))
    self_ns: dict[str, int] = {}

    def close(top: list) -> None:  # [end, op, children's ns, span ns]
        if top[1] is not None:
            self_ns[top[1]] = self_ns.get(top[1], 0) + max(top[3] - top[2], 0)

    for rows in scopes.values():
        rows.sort(key=lambda r: (r[0], -r[1]))
        stack: list[list] = []
        for start, end, op in rows:
            while stack and stack[-1][0] < end:  # not inside the top: the top is done
                close(stack.pop())
            if stack:
                stack[-1][2] += end - start
            stack.append([end, op, 0, end - start])
        while stack:
            close(stack.pop())
    return {k: v / 1000 for k, v in self_ns.items()}


@pytest.mark.parametrize("name", ["hta_v100_ns_resolution_rank-0.pt.trace.json.gz", *RAW_OP_TRACES])
def test_op_self_time_matches_exact_nesting_of_the_raw_json(name):
    """CPU self time per op name against an independent stack nesting in integer ns. On the
    epoch-µs trace this failed while the loader rounded timestamps to float64's 0.25 µs there:
    children then shared a parent's start and nested wrongly (aten::narrow 556 µs, truly 423)."""
    want = _exact_self_us(name)
    ops = attribution(real_trace(name)).ops.set_index("name")["cpu_self_us"]
    assert set(ops.index) == set(want)
    for n, us in want.items():
        assert ops[n] == pytest.approx(us, rel=1e-9, abs=1e-3), n


EXT_TRACES = ["tracelens_h100_bert_small.json.gz", "hta_a100_rank0of2_nccl_data.json.gz",
              "kineto_v100_resnet50_nw4_worker0.1623212756351.pt.trace.json.gz", "tracelens_h100_timesformer_base.json.gz"]


@pytest.mark.parametrize("name", EXT_TRACES)
def test_kernel_to_op_by_external_id_matches_raw_json(name):
    """Plain Python: kernel correlation -> its External id -> the cpu_op carrying that id."""
    raw = raw_events(name)
    ext_key = lambda e: (e.get("args") or {}).get("External id", (e.get("args") or {}).get("external id"))
    op_of_ext = {ext_key(e): e["name"] for e in raw if e.get("cat") in ("cpu_op", "Operator") and ext_key(e) is not None}
    expected = {}
    for e in raw:
        if e.get("cat") in ("kernel", "Kernel") and ext_key(e) in op_of_ext:
            expected[e["args"]["correlation"]] = op_of_ext[ext_key(e)]
    assert len(expected) > 0
    k = real_trace(name)
    ours = attribution(k).kernels
    ours = ours[ours["kind"] == "kernel"].set_index("correlation")["op"].astype(str)
    agree = sum(ours.get(c) == op for c, op in expected.items())
    assert agree == len(expected)


def test_containment_matches_plain_python_when_external_ids_are_unusable():
    """param trace: External ids collide, so the op is the innermost cpu_op around the launch."""
    name = "param_rtx2080ti_linear_kineto.json.gz"
    raw = raw_events(name)
    runtime = {e["args"]["correlation"]: e for e in raw if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    ops_by_tid: dict = {}
    for e in raw:
        if e.get("cat") == "cpu_op":
            ops_by_tid.setdefault(e["tid"], []).append(e)
    longest = max(o["dur"] for ops in ops_by_tid.values() for o in ops)
    for ops in ops_by_tid.values():
        ops.sort(key=lambda o: o["ts"])
    starts = {tid: [o["ts"] for o in ops] for tid, ops in ops_by_tid.items()}
    kernels = [e for e in raw if e.get("cat") == "kernel"][::40]  # a sample of ~220
    ours = attribution(real_trace(name)).kernels
    ours = ours[ours["kind"] == "kernel"].set_index("correlation")["op"].astype(str)
    checked = 0
    for kern in kernels:
        rt = runtime.get(kern["args"]["correlation"])
        if rt is None:
            continue
        ops, st = ops_by_tid.get(rt["tid"], []), starts.get(rt["tid"], [])
        lo, hi = bisect.bisect_left(st, rt["ts"] - longest), bisect.bisect_right(st, rt["ts"])
        around = [o for o in ops[lo:hi] if o["ts"] <= rt["ts"] <= o["ts"] + o["dur"]]
        if not around:
            continue
        inner = max(around, key=lambda o: (o["ts"], -o["dur"]))
        assert ours[kern["args"]["correlation"]] == inner["name"]
        checked += 1
    assert checked > 100


def test_graph_replay_trace_attributes_graph_kernels_to_the_launch():
    a = attribution(real_trace("tracelens_amd_vllm_decode_hipgraph_replay.json.gz")).kernels
    g = a[a["launch_name"].astype(str) == "hipGraphLaunch"]
    assert len(g) == 421
    assert (g["link"] != "none").all()
    assert np.isfinite(g["launch_ts_us"]).all()


def test_backward_kernel_gets_the_module_of_its_forward_op(tmp_path):
    t = SynthTrace()
    module(t, "Linear_0", 0, 50)
    t.cpu_op("aten::linear", 5, 30, ext=t.new_ext(), **{"Sequence number": 7, "Fwd thread id": 0})
    bw = HOST_TID + 1
    ext = t.new_ext()
    t.cpu_op("autograd::engine::evaluate_function: AddmmBackward0", 100, 40, ext=t.new_ext(), tid=bw,
             **{"Sequence number": 7, "Fwd thread id": 1})
    t.cpu_op("aten::mm", 110, 20, ext=ext, tid=bw)
    c = t.new_corr()
    t.runtime("cudaLaunchKernel", 112, 3, corr=c, ext=ext, tid=bw)
    t.kernel("sgemm_bw", 150, 10, corr=c, ext=ext)
    k = attribution(load(t, tmp_path)).kernels.iloc[0]
    assert (k["op"], k["top_op"]) == ("aten::mm", "autograd::engine::evaluate_function: AddmmBackward0")
    assert (k["module"], k["module_via"]) == ("Linear_0", "backward_sequence")
