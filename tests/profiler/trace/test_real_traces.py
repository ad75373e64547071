"""Every real trace loads, and agrees with facts recomputed from its raw JSON (conftest.raw_truth)."""
from __future__ import annotations

import json
import math

import numpy as np

from profiler.trace import COLUMNS, KINDS, Trace
from profiler.trace.schema import GPU_KINDS
from tests.profiler.trace.conftest import HALF_NS_US, loaded, raw_truth, trace_named


def test_columns_and_dtypes(trace_path):
    tr = loaded(trace_path)
    assert isinstance(tr, Trace)
    assert list(tr.events.columns) == list(COLUMNS)
    for col, (dtype, _) in COLUMNS.items():
        assert str(tr.events[col].dtype) == dtype, col
    assert set(tr.events["kind"].cat.categories) == set(KINDS)
    assert tr.events["dur_us"].min() >= 0
    assert tr.events["flops"].isna().all() and tr.events["bytes_moved"].isna().all()


def test_counts_sums_streams_ranks_span(trace_path):
    tr, truth = loaded(trace_path), raw_truth(trace_path)
    ev = tr.events
    kernels = ev[ev["kind"] == "kernel"]
    assert len(kernels) == truth["kernel_count"]
    assert math.isclose(kernels["dur_us"].sum(), truth["kernel_total_us"], rel_tol=1e-12, abs_tol=1e-9)
    as_written = tr.meta["demangled_names"]  # {demangled: mangled}, for ROCm's mangled kernel names
    assert sorted(as_written.get(n, n) for n in kernels["name"].astype(str)) == truth["kernel_names"]
    gpu = ev[ev["kind"].isin(sorted(GPU_KINDS))]
    got_streams = {(int(r), int(d), int(s)) for r, d, s in gpu[["rank", "device", "stream"]].itertuples(index=False)}
    assert got_streams == truth["streams"]
    assert list(tr.ranks) == [truth["rank"]]
    assert tr.meta["t0_us"] == truth["first_ts"]  # exact
    assert ev["ts_us"].min() == 0.0
    assert abs((ev["ts_us"] + ev["dur_us"]).max() - truth["last_end_rel"]) <= HALF_NS_US
    assert len(ev) == len(truth["kept"]) and tr.meta["skipped_events"] == 0
    assert ev["kind"].value_counts()[ev["kind"].value_counts() > 0].to_dict() == truth["by_kind"]


def test_raw_timestamps_to_the_nanosecond(trace_path):
    """ts_us gives back the file's own timestamps (after the first) to the nanosecond, ns fractions
    included, also on Unix-epoch µs clocks (1.7e15), where float64 itself steps by 0.25 µs."""
    tr, truth = loaded(trace_path), raw_truth(trace_path)
    got = np.sort(tr.events["ts_us"].to_numpy())
    t0 = truth["ts_exact"][0]
    want = np.array([float(ts - t0) for ts in truth["ts_exact"]])
    assert np.abs(got - want).max() <= HALF_NS_US


def test_kernel_args_match_raw(trace_path):
    tr, truth = loaded(trace_path), raw_truth(trace_path)
    k = tr.events[tr.events["kind"] == "kernel"]
    raw = [e for e in truth["kept"] if e["cat"] in ("kernel", "Kernel")]

    def total(key, sub=None):
        vals = [(e["args"].get(key)[sub] if sub is not None else e["args"].get(key)) for e in raw
                if isinstance(e["args"].get(key), (list if sub is not None else int))]
        return sum(vals), len(vals)

    for col, key, sub in (("correlation", "correlation", None), ("grid_x", "grid", 0), ("block_z", "block", 2),
                          ("registers_per_thread", "registers per thread", None),
                          ("shared_memory_bytes", "shared memory", None)):
        s, n = total(key, sub)
        assert (int(k[col].sum()), int(k[col].notna().sum())) == (s, n), col
    occ = [e["args"]["est. achieved occupancy %"] for e in raw if "est. achieved occupancy %" in e["args"]]
    assert k["occupancy_pct"].notna().sum() == len(occ)
    assert math.isclose(k["occupancy_pct"].sum(), math.fsum(occ), rel_tol=1e-12, abs_tol=1e-12)
    ext = [e["args"].get("External id", e["args"].get("external id")) for e in raw]
    assert int(k["external_id"].notna().sum()) == sum(isinstance(x, int) for x in ext)


def test_2021_format():
    path = trace_named("kineto_v100_resnet50")
    tr = loaded(path)
    ev = tr.events
    k = ev[ev["kind"] == "kernel"]
    assert set(k["tid"].dropna().unique()) == {7} and set(k["stream"].unique()) == {7}  # "stream 7"
    assert k["external_id"].notna().all()  # lower-case "external id"
    assert k["flow_id"].notna().all()  # `async` "launch" flows
    runtime = ev[ev["kind"] == "cuda_runtime"]
    assert runtime["flow_id"].notna().sum() > 0 and runtime["pid"].notna().all()
    assert {"cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset"} <= set(ev["kind"].astype(str))
    assert ev.loc[ev["kind"] == "cpu_op", "step"].notna().any()
    assert len(tr.memory) == sum(1 for e in raw_truth(path)["doc"]["traceEvents"]
                                 if e.get("ph") == "i" and e.get("name") == "[memory]")


def test_amd_kernels_have_only_launch_fields():
    for prefix in ("hta_mi250", "tracelens_mi300x", "tracelens_amd_vllm"):
        tr = loaded(trace_named(prefix))
        k = tr.events[tr.events["kind"] == "kernel"]
        assert len(k) and k["stream"].notna().all() and k["correlation"].notna().all()
        assert k["registers_per_thread"].isna().all() and k["occupancy_pct"].isna().all()
        assert tr.meta["versions"].get("hip_runtime_version") or prefix == "hta_mi250"


def test_nccl_fields_and_versions():
    tr = loaded(trace_named("hta_a100_rank0of2_nccl"))
    raw = [e for e in raw_truth(trace_named("hta_a100_rank0of2_nccl"))["kept"] if "Collective name" in e["args"]]
    ev = tr.events
    got = ev[ev["collective_name"].notna()]
    assert len(got) == len(raw) > 0
    assert sorted(got["in_msg_nelems"].astype(int)) == sorted(e["args"]["In msg nelems"] for e in raw)
    assert set(got["process_group_desc"].dropna().astype(str)) == {
        e["args"]["Process Group Description"] for e in raw if "Process Group Description" in e["args"]}
    assert int(got["process_group_desc"].notna().sum()) == sum("Process Group Description" in e["args"] for e in raw)
    assert tr.meta["distributed_info"]["backend"] == "nccl"
    assert tr.meta["versions"]["nccl_version"] == "2.17.1"
    assert tr.meta["device_properties"][0]["name"].startswith("NVIDIA A100")


def test_cpu_op_shapes_and_python_ids():
    path = trace_named("tracelens_h100_bert_small")
    tr, truth = loaded(path), raw_truth(path)
    ops = tr.events[tr.events["kind"] == "cpu_op"]
    raw_ops = [e for e in truth["kept"] if e["cat"] == "cpu_op"]
    want = sorted(json.dumps(e["args"]["Input Dims"], separators=(",", ":")) for e in raw_ops
                  if "Input Dims" in e["args"])
    assert sorted(ops["input_dims"].dropna()) == want
    assert ops["input_types"].dropna().str.startswith("[").all()
    py = tr.events[tr.events["kind"] == "python_function"]
    raw_py = [e for e in truth["kept"] if e["cat"] == "python_function"]
    assert int(py["python_id"].sum()) == sum(e["args"]["Python id"] for e in raw_py)
    assert py["python_parent_id"].isna().sum() == sum(e["args"]["Python parent id"] is None for e in raw_py)
    assert tr.meta["versions"]["torch_version"] == "2.6.0+cu124"
    assert "metadata" not in tr.meta  # the environment dump stays out of the Trace


def test_memory_table():
    path = trace_named("tracelens_h100_falconsai")
    tr, truth = loaded(path), raw_truth(path)
    raw = [e for e in truth["doc"]["traceEvents"] if e.get("ph") == "i" and e.get("name") == "[memory]"]
    assert len(tr.memory) == len(raw)
    assert int(tr.memory["bytes"].sum()) == sum(e["args"]["Bytes"] for e in raw)
    assert np.array_equal(np.sort(tr.memory["ts_us"].to_numpy() + tr.meta["t0_us"]),
                          np.sort([e["ts"] for e in raw]))
