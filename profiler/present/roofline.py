"""Roofline figure: op types (or single ops) against the memory slope and compute roof of one dtype.

DESIGN.md, Roofline and Dashboard. A pure figure builder: it takes the roofline analysis's rows
(`profiler.analysis.roofline.aggregate` per op type, or `roofline_points` per op) and the `Ceilings`
they were computed against, and returns a plotly Figure; pages and the HTML report both call it, so
they show the same chart. It never computes a roofline and never imports streamlit.

- x: algorithmic intensity, FLOP per lower-bound byte (inputs + outputs; not measured DRAM traffic);
- y: achieved FLOP/s in GFLOP/s or TFLOP/s, whichever fits the roof's magnitude;
- the roof: y = bandwidth * x up to the ridge (peak / bandwidth), then flat at the peak;
- one marker per row, marker AREA proportional to its total time, coloured by its bound;
- rows with zero, infinite or NaN intensity or FLOP/s have no place on log axes: left out, counted
  in the subtitle with their share of time.

Annotations on log axes take log10 coordinates (plotly's rule for annotations on log axes).
"""
from __future__ import annotations

import html
import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from profiler.analysis.roofline import RooflineError
from profiler.capture.devices import Ceilings
from profiler.present.units import si

REQUIRED_COLUMNS = ("name", "dur_us", "algorithmic_intensity_flop_per_byte", "achieved_flops_per_s", "bound")
BOUND_COLOURS = {"memory": "#1f77b4", "compute": "#d62728"}  # plotly's default blue / red
ROOF_COLOUR = "#444444"
WEBGL_ABOVE = 2000  # more markers than this: Scattergl (SVG slows down past a few thousand)
MAX_MARKER_PX = 44  # diameter of the marker with the largest total time
MIN_MARKER_PX = 5
X_TITLE = "algorithmic intensity (FLOP / byte, algorithmic lower-bound bytes)"


def flops_unit(peak_flops_per_s: float) -> tuple[str, float]:
    """('TFLOP/s', 1e12) when the roof reaches 1 TFLOP/s, else ('GFLOP/s', 1e9)."""
    return ("TFLOP/s", 1e12) if peak_flops_per_s >= 1e12 else ("GFLOP/s", 1e9)


def source_label(ceilings: Ceilings) -> str:
    """'measured (quick)', 'table:H200-SXM-141GB', ...: where the roofs came from."""
    mode = ceilings.details.get("mode")
    return f"{ceilings.source} ({mode})" if mode and ceilings.source == "measured" else ceilings.source


def _check(rows: pd.DataFrame, ceilings: Ceilings, dtype: str) -> float:
    """The peak for `dtype`; RooflineError on missing columns or an uncovered dtype."""
    missing = [c for c in REQUIRED_COLUMNS if c not in rows.columns]
    if missing:
        raise RooflineError(f"roofline figure: rows lack column(s) {', '.join(missing)} "
                            "(pass roofline points or aggregate())")
    peak = ceilings.peak_for(dtype)
    if peak is None:
        raise RooflineError(f"roofline figure: ceilings ({ceilings.source}) have no peak for {dtype!r}; "
                            f"known: {', '.join(ceilings.peak_flops_per_s)}")
    return peak


def _plottable(rows: pd.DataFrame) -> np.ndarray:
    """Rows that fit on log-log axes: finite, positive intensity and FLOP/s, and positive time."""
    x = pd.to_numeric(rows["algorithmic_intensity_flop_per_byte"], errors="coerce").to_numpy(float)
    y = pd.to_numeric(rows["achieved_flops_per_s"], errors="coerce").to_numpy(float)
    t = pd.to_numeric(rows["dur_us"], errors="coerce").to_numpy(float)
    return np.isfinite(x) & (x > 0) & np.isfinite(y) & (y > 0) & np.isfinite(t) & (t > 0)


def _column(rows: pd.DataFrame, name: str, default: object) -> pd.Series:
    return rows[name] if name in rows.columns else pd.Series(default, index=rows.index)


def _hover_labels(rows: pd.DataFrame) -> np.ndarray:
    """'name (kind, dtype)' per row, HTML-escaped: plotly reads hover text as pseudo-HTML (`void
    k<float>` would lose its template argument) and the HTML report must never carry raw trace strings.
    Built once per distinct label: a trace has few op types and many calls."""
    if rows.empty:
        return np.array([], dtype=object)
    codes, uniques = [], []
    for col in (rows["name"], _column(rows, "kind", ""), _column(rows, "dtype", "")):
        c, u = pd.factorize(col, use_na_sentinel=False)  # per column (categorical: no strings built)
        codes.append(c.astype(np.int64))
        uniques.append([str(v) for v in u])
    n_kind, n_dtype = len(uniques[1]), len(uniques[2])
    key = (codes[0] * n_kind + codes[1]) * n_dtype + codes[2]  # one integer per (name, kind, dtype)
    distinct, inverse = np.unique(key, return_inverse=True)
    labels = []
    for k in distinct.tolist():
        rest, d = divmod(k, n_dtype)
        n, kind = divmod(rest, n_kind)
        name, kind_s, dtype_s = uniques[0][n], uniques[1][kind], uniques[2][d]
        labels.append(html.escape(f"{name} ({kind_s}, {dtype_s})" if kind_s or dtype_s else name))
    return np.array(labels, dtype=object)[inverse]


def _hover_numbers(rows: pd.DataFrame) -> np.ndarray:
    """customdata, float64 (n, 4): calls, total time (µs), % of roof, headroom (µs). Numbers only, so
    plotly ships it as one typed array (an object array cost ~0.5 s to serialise at 50k points)."""
    cols = [_column(rows, "count", 1), rows["dur_us"], _column(rows, "pct_of_roof", np.nan),
            _column(rows, "headroom_us", np.nan)]
    return np.column_stack([pd.to_numeric(c, errors="coerce").to_numpy(float) for c in cols])


def _hovertemplate(unit: str) -> str:
    return ("<b>%{text}</b><br>calls: %{customdata[0]:,.0f}<br>total time: %{customdata[1]:,.1f} µs<br>"
            "intensity: %{x:.3g} FLOP/B (algorithmic)<br>achieved: %{y:.3g} " + unit + "<br>"
            "% of roof: %{customdata[2]:.3g}%<br>headroom: %{customdata[3]:,.1f} µs<extra>%{fullData.name}</extra>")


def _marker_traces(rows: pd.DataFrame, scale: float, unit: str, sizeref: float, webgl: bool) -> list:
    """One scatter per bound (legend: 'memory-bound', 'compute-bound'), marker area ~ total time."""
    cls = go.Scattergl if webgl else go.Scatter
    out = []
    bounds = rows["bound"].astype(str)
    for bound in [*BOUND_COLOURS, *sorted(set(bounds) - set(BOUND_COLOURS))]:
        part = rows[bounds == bound]
        if part.empty:
            continue
        out.append(cls(
            x=part["algorithmic_intensity_flop_per_byte"].to_numpy(float),
            y=part["achieved_flops_per_s"].to_numpy(float) / scale,
            mode="markers", name=f"{bound}-bound", text=_hover_labels(part), customdata=_hover_numbers(part),
            hovertemplate=_hovertemplate(unit),
            marker=dict(size=part["dur_us"].to_numpy(float), sizemode="area", sizeref=sizeref,
                        sizemin=MIN_MARKER_PX, color=BOUND_COLOURS.get(bound, "#7f7f7f"), opacity=0.7,
                        line=dict(width=0.5, color="white"))))
    return out


def _roof_traces(x_lo: float, x_hi: float, ridge: float, peak: float, bw: float, scale: float,
                 unit: str, dtype: str, source: str) -> list[go.Scatter]:
    """The memory slope [x_lo, ridge] and the flat compute roof [ridge, x_hi]."""
    line = dict(color=ROOF_COLOUR, width=2)
    return [
        go.Scatter(x=[x_lo, ridge], y=[bw * x_lo / scale, peak / scale], mode="lines", line=line,
                   name=f"memory roof: {si(bw, 'B/s')} ({source})",
                   hovertemplate="memory roof: %{y:.3g} " + unit + " at %{x:.3g} FLOP/B<extra></extra>"),
        go.Scatter(x=[ridge, x_hi], y=[peak / scale, peak / scale], mode="lines", line={**line, "dash": "dash"},
                   name=f"{dtype} peak: {si(peak, 'FLOP/s')} ({source})",
                   hovertemplate="compute roof: %{y:.3g} " + unit + "<extra></extra>"),
    ]


def _roof_annotations(x_lo: float, ridge: float, x_hi: float, peak: float, bw: float, scale: float,
                      dtype: str) -> list[dict]:
    """Labels on the roof, in log10 coordinates: bandwidth on the slope, peak on the flat, the ridge."""
    lx_lo, lridge, lx_hi = math.log10(x_lo), math.log10(ridge), math.log10(x_hi)
    slope_x = lx_lo + 0.35 * (lridge - lx_lo)  # a third of the way up the slope, far from the ridge label
    font = dict(size=12, color=ROOF_COLOUR)
    return [
        dict(x=slope_x, y=math.log10(bw * 10 ** slope_x / scale), text=f"{si(bw, 'B/s')} memory",
             showarrow=False, xanchor="right", yanchor="bottom", font=font),
        dict(x=lx_lo + 0.85 * (lx_hi - lx_lo) if lx_hi > lridge else lx_hi, y=math.log10(peak / scale),
             text=f"{dtype} peak {si(peak, 'FLOP/s')}", showarrow=False, xanchor="right", yanchor="bottom",
             font=font),
        dict(x=lridge, y=math.log10(peak / scale), text=f"ridge {ridge:.3g} FLOP/B", showarrow=True,
             arrowhead=0, ax=0, ay=40, yanchor="top", font=dict(size=11, color=ROOF_COLOUR)),
    ]


def _left_out_line(rows: pd.DataFrame, ok: np.ndarray) -> str:
    n_out = int((~ok).sum())
    if not n_out:
        return f"{len(rows):,} shown"
    t = pd.to_numeric(rows["dur_us"], errors="coerce").fillna(0.0).to_numpy(float)
    share = 100.0 * t[~ok].sum() / t.sum() if t.sum() > 0 else 0.0
    return (f"{int(ok.sum()):,} shown; {n_out:,} left out (zero or undefined intensity or FLOP/s, "
            f"e.g. copies: {share:.3g}% of the time)")


def _above_roof_note(shown: pd.DataFrame, peak: float, bw: float) -> str:
    """'; N above the memory roof (...)' and '; M above the peak (...)', each when markers beat it.
    Over the memory roof is expected (the bytes are a lower bound and data already in cache moves
    faster than DRAM); over the peak FLOP/s means the peak is low or the FLOPs are counted high."""
    x = shown["algorithmic_intensity_flop_per_byte"].to_numpy(float)
    y = shown["achieved_flops_per_s"].to_numpy(float)
    over_peak = y > peak * (1 + 1e-9)
    over_memory = ~over_peak & (y > bw * x * (1 + 1e-9))
    note = f"; {int(over_memory.sum()):,} above the memory roof (lower-bound bytes, cached data)" if over_memory.any() else ""
    if over_peak.any():
        note += f"; {int(over_peak.sum()):,} above the peak FLOP/s (a peak measured low, or FLOPs counted high)"
    return note


def _y_span(shown: pd.DataFrame, roof_lo: float, peak: float) -> tuple[float, float]:
    y = shown["achieved_flops_per_s"].to_numpy(float)
    return min(roof_lo, float(y.min()) if len(y) else peak), max(peak, float(y.max()) if len(y) else peak)


def _decade_ticks(lo: float, hi: float) -> dict:
    """One labelled tick per decade when the axis spans two or more (plotly's default then labels
    the 2s and 5s of every decade too, a wall of digits); plotly's own choice on shorter spans."""
    return {"dtick": 1} if math.log10(hi / lo) >= 2 else {}


def roofline_figure(rows: pd.DataFrame, ceilings: Ceilings, dtype: str = "fp32", *,
                    title: str = "Roofline", what: str = "op types", webgl_above: int = WEBGL_ABOVE,
                    height_px: int = 520) -> go.Figure:
    """Log-log roofline of `rows` under the `dtype` roof of `ceilings`.

    Args:
        rows: `aggregate()` rows (one per op type; `count` = calls) or `roofline_points` rows (one per op).
        ceilings: the Ceilings the rows were computed against (their source is printed on the roof).
        dtype: roofline dtype of the roof to draw ("fp32", "bf16", ...); rows of other dtypes keep
            their own % of roof in the hover.
        what: what one marker is, for the subtitle ("op types", "ops", "kernels").
        webgl_above: more markers than this are drawn with Scattergl.
    Returns:
        A plotly Figure; RooflineError when `rows` lack the roofline columns or `dtype` has no peak.
    """
    peak = _check(rows, ceilings, dtype)
    bw = ceilings.mem_bw_bytes_per_s
    ridge = peak / bw
    unit, scale = flops_unit(peak)
    ok = _plottable(rows)
    shown = rows[ok]
    x = shown["algorithmic_intensity_flop_per_byte"].to_numpy(float)
    x_lo = min(float(x.min()) if len(x) else ridge, ridge) / 3.0
    x_hi = max(float(x.max()) if len(x) else ridge, ridge) * 3.0
    t_max = float(shown["dur_us"].max()) if len(shown) else 1.0
    sizeref = 2.0 * t_max / MAX_MARKER_PX ** 2  # plotly's area-mode recipe: the largest time gets MAX_MARKER_PX
    source = source_label(ceilings)
    fig = go.Figure([*_roof_traces(x_lo, x_hi, ridge, peak, bw, scale, unit, dtype, source),
                     *_marker_traces(shown, scale, unit, sizeref, len(shown) > webgl_above)])
    lines = (f"{what}: {_left_out_line(rows, ok)}{_above_roof_note(shown, peak, bw)}",
             f"marker area ∝ total time; roofs {source}")
    fig.update_layout(
        title=dict(text=html.escape(title), subtitle=dict(text="<br>".join(map(html.escape, lines)))),
        xaxis=dict(type="log", title=dict(text=X_TITLE), exponentformat="power", **_decade_ticks(x_lo, x_hi)),
        yaxis=dict(type="log", title=dict(text=f"achieved {unit}"), exponentformat="power",
                   **_decade_ticks(*_y_span(shown, bw * x_lo, peak))),
        annotations=_roof_annotations(x_lo, ridge, x_hi, peak, bw, scale, dtype),
        legend=dict(orientation="h", yanchor="top", y=-0.18, xanchor="left", x=0),
        height=height_px, margin=dict(t=100, b=110, l=70, r=20), hovermode="closest")
    return fig
