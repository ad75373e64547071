"""The roofline figure builder (profiler/present/roofline.py) on synthetic rows with known answers,
and on a real capture of the tiny zoo MLP."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from profiler.analysis.roofline import RooflineError, aggregate, roofline, roofline_points
from profiler.capture.backends import CapturePlan
from profiler.capture.devices import Ceilings
from profiler.capture.runner import capture
from profiler.present.roofline import BOUND_COLOURS, roofline_figure

# peak 100 GFLOP/s, bandwidth 10 GB/s: the ridge is at 10 FLOP/B
CEIL = Ceilings({"fp32": 100e9}, 10e9, "measured", {"mode": "quick"})


def _rows() -> pd.DataFrame:
    """Two plottable op types (intensity 1 and 100) and two that cannot sit on log axes."""
    return pd.DataFrame({
        "kind": ["cpu_op"] * 4, "dtype": ["fp32"] * 4,
        "name": ["aten::add", "aten::mm<float>", "aten::copy_", "aten::fill_"],
        "count": [4, 2, 3, 1], "dur_us": [30.0, 120.0, 10.0, 40.0],
        "algorithmic_intensity_flop_per_byte": [1.0, 100.0, 0.0, np.inf],
        "achieved_flops_per_s": [5e9, 80e9, 0.0, 2e9],
        "bound": ["memory", "compute", "memory", "compute"],
        "pct_of_roof": [50.0, 80.0, 1.0, 1.0], "headroom_us": [15.0, 24.0, 9.9, 39.6]})


def _by_name(fig) -> dict:
    return {t.name: t for t in fig.data}


def _markers(fig) -> list:
    return [t for t in fig.data if t.name.endswith("-bound")]


def test_roof_is_the_memory_slope_then_the_flat_peak():
    fig = roofline_figure(_rows(), CEIL, "fp32")
    slope, flat = fig.data[0], fig.data[1]
    assert slope.name == "memory roof: 10 GB/s (measured (quick))"
    assert flat.name == "fp32 peak: 100 GFLOP/s (measured (quick))"
    assert fig.layout.yaxis.title.text == "achieved GFLOP/s"
    # slope: y = 10 GB/s * x, in GFLOP/s, ending at the ridge (10 FLOP/B, 100 GFLOP/s)
    assert slope.x[-1] == pytest.approx(10.0) and slope.y[-1] == pytest.approx(100.0)
    for x, y in zip(slope.x, slope.y):
        assert y == pytest.approx(10.0 * x)
    assert flat.x[0] == pytest.approx(10.0) and list(flat.y) == pytest.approx([100.0, 100.0])
    # the roof spans every marker's intensity
    assert slope.x[0] < 1.0 and flat.x[-1] > 100.0
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert "algorithmic" in fig.layout.xaxis.title.text and "FLOP / byte" in fig.layout.xaxis.title.text


def test_markers_carry_the_inputs_sized_by_time_coloured_by_bound():
    fig = roofline_figure(_rows(), CEIL, "fp32")
    marks = _by_name(fig)
    mem, comp = marks["memory-bound"], marks["compute-bound"]
    assert list(mem.x) == [1.0] and list(mem.y) == pytest.approx([5.0])  # 5e9 FLOP/s in GFLOP/s
    assert list(comp.x) == [100.0] and list(comp.y) == pytest.approx([80.0])
    assert mem.marker.color == BOUND_COLOURS["memory"] != comp.marker.color == BOUND_COLOURS["compute"]
    # marker area ~ total time: the sizes are the times, in area mode
    assert mem.marker.sizemode == comp.marker.sizemode == "area"
    assert list(mem.marker.size) == [30.0] and list(comp.marker.size) == [120.0]
    assert mem.marker.sizeref == comp.marker.sizeref  # one scale for both bounds
    # hover: escaped name, calls, time, % of roof, headroom
    assert comp.text[0] == "aten::mm&lt;float&gt; (cpu_op, fp32)"
    assert list(comp.customdata[0]) == [2, 120.0, 80.0, 24.0]  # calls, time, % of roof, headroom
    assert "% of roof" in comp.hovertemplate and "headroom" in comp.hovertemplate
    assert all(t.type == "scatter" for t in fig.data)


def test_left_out_rows_are_counted_with_their_time_share():
    sub = roofline_figure(_rows(), CEIL, "fp32").layout.title.subtitle.text
    share = 100 * (10.0 + 40.0) / (30.0 + 120.0 + 10.0 + 40.0)  # copy_ (intensity 0) + fill_ (inf)
    assert "2 shown; 2 left out" in sub and f"{share:.3g}% of the time" in sub
    assert "roofs measured (quick)" in sub
    assert "left out" not in roofline_figure(_rows().iloc[:2], CEIL).layout.title.subtitle.text


def test_annotations_use_log10_coordinates():
    fig = roofline_figure(_rows(), CEIL, "fp32")
    ridge = next(a for a in fig.layout.annotations if a.text.startswith("ridge"))
    assert ridge.text == "ridge 10 FLOP/B" and ridge.x == pytest.approx(1.0) and ridge.y == pytest.approx(2.0)
    slope = next(a for a in fig.layout.annotations if a.text.endswith("memory"))
    assert slope.y == pytest.approx(math.log10(10.0 * 10 ** slope.x))  # on the slope y = 10 x
    peak = next(a for a in fig.layout.annotations if "peak" in a.text)
    assert peak.y == pytest.approx(2.0) and peak.x > 1.0  # on the flat part, right of the ridge


def test_tflops_unit_webgl_and_per_op_points():
    ceil = Ceilings({"bf16": 500e12, "fp32": 50e12}, 2e12, "table:H100-SXM5-80GB")
    n = 3000
    rng = np.random.default_rng(0)
    x = 10 ** rng.uniform(-1, 3, n)
    y = np.minimum(500e12, 2e12 * x) * rng.uniform(0.01, 1, n)
    pts = pd.DataFrame({"name": [f"k{i % 7}" for i in range(n)], "dur_us": rng.uniform(1, 100, n),
                        "algorithmic_intensity_flop_per_byte": x, "achieved_flops_per_s": y,
                        "bound": np.where(x < 250, "memory", "compute")})
    fig = roofline_figure(pts, ceil, "bf16", what="kernels")
    assert fig.layout.yaxis.title.text == "achieved TFLOP/s"
    assert fig.data[1].y[0] == pytest.approx(500.0)  # the bf16 roof, in TFLOP/s
    marks = _markers(fig)
    assert {t.type for t in marks} == {"scattergl"} and sum(len(t.x) for t in marks) == n
    got = np.sort(np.concatenate([t.y for t in marks]))
    np.testing.assert_allclose(got, np.sort(y) / 1e12)
    assert marks[0].customdata[0][0] == 1 and marks[0].text[0] == "k0"  # no count/kind/dtype columns
    assert fig.layout.title.subtitle.text.startswith("kernels: 3,000 shown")
    assert "table:H100-SXM5-80GB" in fig.data[0].name


def test_bad_rows_and_dtype_raise_one_line():
    with pytest.raises(RooflineError, match="lack column.*achieved_flops_per_s"):
        roofline_figure(_rows().drop(columns="achieved_flops_per_s"), CEIL)
    with pytest.raises(RooflineError, match="no peak for 'bf16'"):
        roofline_figure(_rows(), CEIL, "bf16")


def test_empty_rows_still_draw_the_roof():
    fig = roofline_figure(_rows().iloc[:0], CEIL)
    assert len(fig.data) == 2 and "0 shown" in fig.layout.title.subtitle.text


def test_real_mlp_capture_one_marker_per_op_type_with_finite_intensity(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res = capture("mlp", CapturePlan(mode="train", wait=0, warmup=0, active=1), tmp_path, size="tiny")
    finally:
        torch.set_num_threads(threads)
    result = roofline(res.trace, CEIL)
    fig = roofline_figure(result.by_op_type, CEIL, "fp32")
    # the truth, summed here from the event rows: op types whose summed FLOPs and bytes are both > 0
    ev = res.trace.events
    ev = ev[(ev["kind"] == "cpu_op") & ev["flops"].notna() & ev["bytes_moved"].notna() & (ev["dur_us"] > 0)]
    sums = ev.groupby(ev["name"].astype(str))[["flops", "bytes_moved", "dur_us"]].sum()
    plottable = sums[(sums["flops"] > 0) & (sums["bytes_moved"] > 0)]
    marks = _markers(fig)
    assert sum(len(t.x) for t in marks) == len(plottable) > 2
    drawn = {label.removesuffix(" (cpu_op, fp32)"): (x, y) for t in marks for label, x, y in zip(t.text, t.x, t.y)}
    assert set(drawn) == set(plottable.index)
    for name, row in plottable.iterrows():
        x, y = drawn[name]
        assert x == pytest.approx(row["flops"] / row["bytes_moved"])
        assert y == pytest.approx(row["flops"] / (row["dur_us"] / 1e6) / 1e9)
    n_out = len(result.by_op_type) - len(plottable)
    assert (f"{len(plottable)} shown; {n_out} left out" if n_out else f"{len(plottable)} shown") \
        in fig.layout.title.subtitle.text
    # per-op points of the same capture: one marker per op with finite intensity and FLOP/s
    points, _ = roofline_points(res.trace, CEIL)
    per_op = roofline_figure(points, CEIL, what="ops")
    assert sum(len(t.x) for t in _markers(per_op)) == int(((ev["flops"] > 0) & (ev["bytes_moved"] > 0)).sum())
    assert aggregate(points)["count"].sum() == len(points)


def test_log_axes_tick_once_per_decade_on_wide_spans():
    fig = roofline_figure(_rows(), CEIL)  # x from 1/3 to 300 (2.95 decades), y from 3.3 to 100 GFLOP/s (1.5)
    assert fig.layout.xaxis.dtick == 1 and fig.layout.yaxis.dtick is None
    narrow = roofline_figure(_rows().iloc[:1].assign(algorithmic_intensity_flop_per_byte=10.0,
                                                      achieved_flops_per_s=90e9), CEIL)
    assert narrow.layout.xaxis.dtick is None  # 10/3 .. 30: under two decades, plotly picks


def test_markers_above_the_roof_are_counted():
    rows = _rows().iloc[:2].copy()
    assert "above the" not in roofline_figure(rows, CEIL).layout.title.subtitle.text
    rows.loc[0, "achieved_flops_per_s"] = 12e9  # intensity 1: the memory roof allows 10 GFLOP/s
    rows.loc[1, "achieved_flops_per_s"] = 101e9  # intensity 100: the peak is 100 GFLOP/s
    subtitle = roofline_figure(rows, CEIL).layout.title.subtitle.text
    assert "; 1 above the memory roof (lower-bound bytes, cached data)" in subtitle
    assert "; 1 above the peak FLOP/s (a peak measured low, or FLOPs counted high)" in subtitle
    rows.loc[1, "achieved_flops_per_s"] = 99e9
    assert "peak" not in roofline_figure(rows, CEIL).layout.title.subtitle.text
