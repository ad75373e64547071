"""Roofline on synthetic ops whose answers are known by hand (exact arithmetic on round numbers)."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from profiler.analysis.registry import ANALYSES
from profiler.analysis.roofline import (INTENSITY_NOTE, RooflineError, aggregate, roofline, roofline_points,
                                        roofline_table)
from profiler.capture.devices import Ceilings, lookup_device
from profiler.trace.model import Trace, empty_frame
from profiler.trace.schema import COLUMNS

# Peak 1e12 FLOP/s (fp32), 2e12 (bf16), bandwidth 1e11 B/s -> ridge 10 FLOP/B (fp32), 20 (bf16).
CEIL = Ceilings({"fp32": 1e12, "bf16": 2e12}, 1e11, "measured", {"why": "test"})


def make_trace(rows: list[dict], meta: dict | None = None) -> Trace:
    base = empty_frame(COLUMNS)
    df = pd.DataFrame(rows)
    events = pd.concat([base, df], ignore_index=True)[list(COLUMNS)]
    for col, (dtype, _) in COLUMNS.items():
        events[col] = events[col].astype(dtype)
    return Trace(events, meta or {"sources": ("synthetic",), "device_properties": ()})


def op(name, flops, nbytes, dur_us, kind="cpu_op", ext=None, types=None, ts=0.0, tid=1):
    return {"rank": 0, "kind": kind, "name": name, "ts_us": ts, "dur_us": dur_us, "flops": flops,
            "bytes_moved": nbytes, "external_id": ext, "input_types": types, "pid": 1, "tid": tid}


def test_known_answers_per_op():
    trace = make_trace([
        # memory bound: I = 1e6/1e6 = 1 < 10; roof time = max(1e6/1e12, 1e6/1e11) = 10 us; dur 20 us
        op("aten::add", 1e6, 1e6, 20.0, types='["float","float"]'),
        # compute bound: I = 1e9/1e6 = 1000 > 10; roof time = max(1e-3 s, 1e-5 s) = 1000 us; dur 4000 us
        op("aten::mm", 1e9, 1e6, 4000.0, types='["float","float"]'),
        # bf16 via input_types: roof time = max(1e9/2e12, 1e6/1e11) = 500 us; dur 1000 us
        op("aten::mm", 1e9, 1e6, 1000.0, types='["c10::BFloat16","c10::BFloat16"]'),
    ])
    pts, excluded = roofline_points(trace, CEIL)
    assert excluded == {"no_flops_or_bytes": 0, "no_work": 0, "zero_duration": 0}
    add, mm32, mm16 = (pts.iloc[i] for i in range(3))
    assert add["algorithmic_intensity_flop_per_byte"] == 1.0 and add["bound"] == "memory"
    assert math.isclose(add["time_at_roof_us"], 10.0) and math.isclose(add["pct_of_roof"], 50.0)
    assert math.isclose(add["headroom_us"], 10.0)
    assert math.isclose(add["achieved_bytes_per_s"], 1e6 / 20e-6) and math.isclose(add["achieved_flops_per_s"], 5e10)
    assert mm32["bound"] == "compute" and mm32["dtype"] == "fp32" and mm32["ridge_flop_per_byte"] == 10.0
    assert math.isclose(mm32["time_at_roof_us"], 1000.0) and math.isclose(mm32["pct_of_roof"], 25.0)
    assert math.isclose(mm32["headroom_us"], 3000.0)
    assert mm16["dtype"] == "bf16" and mm16["peak_flops_per_s"] == 2e12
    assert math.isclose(mm16["time_at_roof_us"], 500.0) and math.isclose(mm16["pct_of_roof"], 50.0)


def test_ridge_boundary_and_edge_cases():
    trace = make_trace([
        op("at_ridge", 1e7, 1e6, 100.0),  # I = 10 = ridge -> compute (not below the ridge)
        op("copy", 0.0, 4e6, 80.0),  # no FLOPs: I = 0, memory bound, roof time 40 us
        op("pure_math", 1e6, 0.0, 2.0),  # no bytes: I = inf, compute bound, roof time 1 us
        op("uploaded", float("nan"), float("nan"), 5.0),
        op("empty", 0.0, 0.0, 5.0),
        op("instant", 1e6, 1e6, 0.0),
    ])
    pts, excluded = roofline_points(trace, CEIL)
    assert excluded == {"no_flops_or_bytes": 1, "no_work": 1, "zero_duration": 1}
    by = pts.set_index("name")
    assert by.loc["at_ridge", "bound"] == "compute"
    assert by.loc["copy", "bound"] == "memory" and math.isclose(by.loc["copy", "time_at_roof_us"], 40.0)
    assert math.isinf(by.loc["pure_math", "algorithmic_intensity_flop_per_byte"]) and by.loc["pure_math", "bound"] == "compute"
    assert math.isclose(by.loc["pure_math", "pct_of_roof"], 50.0)


def test_kernel_takes_dtype_of_its_op_and_aggregates_per_op_type():
    trace = make_trace([
        op("aten::mm", 1e9, 1e6, 1000.0, ext=7, types='["c10::BFloat16"]'),
        op("gemm_kernel", 1e9, 1e6, 800.0, kind="kernel", ext=7),
        op("aten::add", 1e6, 1e6, 20.0, types='["float"]'),
        op("aten::add", 3e6, 3e6, 40.0, types='["float"]'),
    ])
    pts, _ = roofline_points(trace, CEIL)
    assert pts.set_index("name").loc["gemm_kernel", "dtype"] == "bf16"
    table = roofline_table(trace, CEIL).set_index(["kind", "name"])
    add = table.loc[("cpu_op", "aten::add")]
    # sums: flops 4e6, bytes 4e6, dur 60 us; roof time 10 + 30 = 40 us
    assert add["count"] == 2 and add["algorithmic_intensity_flop_per_byte"] == 1.0 and add["bound"] == "memory"
    assert math.isclose(add["time_at_roof_us"], 40.0) and math.isclose(add["pct_of_roof"], 100 * 40 / 60)
    assert math.isclose(add["headroom_us"], 20.0)
    assert list(roofline_table(trace, CEIL)["headroom_us"]) == sorted(roofline_table(trace, CEIL)["headroom_us"], reverse=True)


def test_registered_analysis_defaults_to_device_table_and_says_why_not():
    assert "roofline" in ANALYSES
    h100 = {"name": "NVIDIA H100 80GB HBM3", "numSms": 132}
    trace = make_trace([op("aten::mm", 2e12, 1e9, 4000.0, types='["c10::BFloat16"]')],
                       {"sources": ("x",), "device_properties": (h100,)})
    res = ANALYSES["roofline"](trace)
    assert res.ceilings.source == "table:H100-SXM5-80GB" and res.note == INTENSITY_NOTE
    # bf16 dense 989.4 TFLOP/s (never the 1979 sparse figure): 2e12 / 989.4e12 s = 2021.4 us
    assert math.isclose(res.points.iloc[0]["time_at_roof_us"], 2e12 / 989.4e12 * 1e6)
    no_device = make_trace([op("aten::mm", 1e9, 1e6, 10.0)])
    res = roofline(no_device)
    assert res.ceilings is None and res.points.empty and "deviceProperties" in res.reason
    uploaded = make_trace([op("aten::mm", float("nan"), float("nan"), 10.0)], {"sources": ("x",), "device_properties": (h100,)})
    res = roofline(uploaded)
    assert res.points.empty and res.excluded["no_flops_or_bytes"] == 1 and "FLOPs" in res.reason


def test_per_module_aggregation_when_attributed():
    trace = make_trace([op("aten::mm", 1e9, 1e6, 1000.0), op("aten::add", 1e6, 1e6, 20.0)])
    events = trace.events.assign(module=["block.0.mlp", "block.0.mlp"])
    res = roofline(Trace(events, trace.meta), ceilings=CEIL)
    row = res.by_module.set_index("module").loc["block.0.mlp"]
    assert row["count"] == 2 and math.isclose(row["time_at_roof_us"], 1000.0 + 10.0)


def test_module_rollup_sums_children_into_their_ancestors():
    """rollup_modules(depth) over the per-module table equals aggregating the points with each
    module name cut to `depth` segments, and the known sums by hand: block.0 at depth 2 holds
    its own add (roof 10 us) and its mlp's mm + add (1000 + 10 us)."""
    from profiler.analysis.roofline import rollup_modules

    trace = make_trace([op("aten::mm", 1e9, 1e6, 1000.0), op("aten::add", 1e6, 1e6, 20.0),
                        op("aten::add", 1e6, 1e6, 40.0), op("aten::mul", 2e6, 1e6, 30.0)])
    events = trace.events.assign(module=["block.0.mlp", "block.0.mlp", "block.0", "head"])
    res = roofline(Trace(events, trace.meta), ceilings=CEIL)
    up = rollup_modules(res.by_module, 2, CEIL.mem_bw_bytes_per_s).set_index("module")
    assert sorted(up.index) == ["block.0", "head"]
    block = up.loc["block.0"]
    assert block["count"] == 3 and math.isclose(block["dur_us"], 1060.0)
    assert math.isclose(block["time_at_roof_us"], 1020.0) and math.isclose(block["pct_of_roof"], 100 * 1020 / 1060)
    assert block["bound"] == "compute"  # 1.002e9 FLOPs over 3e6 bytes: 334 FLOP/B, past the ridge (10)
    cut = res.points.assign(module=res.points["module"].str.split(".").str[:2].str.join("."))
    want = aggregate(cut, ("module", "dtype")).set_index("module")
    pd.testing.assert_frame_equal(up.sort_index()[want.columns], want.sort_index(), check_dtype=False)
    assert rollup_modules(res.by_module, 5, CEIL.mem_bw_bytes_per_s)["module"].tolist() == res.by_module["module"].tolist()
    with pytest.raises(RooflineError, match="depth"):
        rollup_modules(res.by_module, 0, CEIL.mem_bw_bytes_per_s)


def test_dtype_without_a_peak_falls_back_to_fp32_and_is_counted():
    trace = make_trace([op("x", 1e6, 1e6, 20.0), op("y", 1e6, 1e6, 20.0, types='["double"]')])
    pts, excluded = roofline_points(trace, CEIL, default_dtype="fp64")  # CEIL has fp32 and bf16 only
    assert excluded["no_peak_for_fp64_used_fp32"] == 2
    # the rows keep the dtype they ran in; only the roof is fp32's
    assert set(pts["dtype"]) == {"fp64"} and (pts["peak_flops_per_s"] == CEIL.peak_for("fp32")).all()
    with pytest.raises(RooflineError):
        roofline_points(trace, Ceilings({"bf16": 1e12}, 1e11, "measured"), default_dtype="fp64")
    assert lookup_device("NVIDIA L4").spec.ceilings().peak_for("fp64") is None


def test_modules_from_nn_module_scopes_by_containment_and_external_id():
    nan = float("nan")
    trace = make_trace([
        op("nn.Module: Block", nan, nan, 100.0, kind="python_function", ts=0.0),
        op("nn.Module: Linear", nan, nan, 40.0, kind="python_function", ts=10.0),
        op("aten::mm", 1e9, 1e6, 30.0, ts=15.0, ext=3),  # inside Linear inside Block -> Linear
        op("aten::add", 1e6, 1e6, 10.0, ts=60.0),  # inside Block only
        op("aten::relu", 1e6, 1e6, 10.0, ts=60.0, tid=2),  # other thread: no module
        op("gemm", 1e9, 1e6, 25.0, kind="kernel", ts=20.0, ext=3, tid=7),  # via External id -> Linear
    ])
    res = roofline(trace, ceilings=CEIL)
    assert {n: (None if pd.isna(m) else m) for n, m in zip(res.points["name"], res.points["module"])} == {
        "aten::mm": "Linear", "aten::add": "Block", "aten::relu": None, "gemm": "Linear"}
    linear = res.by_module.set_index("module").loc["Linear"]
    assert linear["count"] == 2 and math.isclose(linear["dur_us"], 55.0)


def test_real_uploaded_trace_excludes_every_row_with_a_count():
    """An uploaded H100 trace: table ceilings from its deviceProperties, no FLOPs -> all excluded."""
    import gzip
    import json
    from pathlib import Path

    from profiler.trace import load_trace

    path = Path(__file__).resolve().parents[2] / "data" / "traces" / "tracelens_h100_bert_small.json.gz"
    with gzip.open(path, "rt") as fh:
        raw = json.load(fh)
    expected = sum(1 for e in raw["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "kernel"))
    res = roofline(load_trace(path))
    assert res.ceilings.source == "table:H100-SXM5-80GB"
    assert res.points.empty and res.excluded["no_flops_or_bytes"] == expected > 0
    assert "uploaded traces" in res.reason
