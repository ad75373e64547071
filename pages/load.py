"""Load page: upload trace files, pick a bundled sample, an earlier capture or a local path; show the summary."""
from __future__ import annotations

import os

import streamlit as st

from pages import load_view as lv
from pages.state import current_trace, load_paths, load_uploaded, require_router, sample_traces, set_trace
from profiler.capture.artifacts import recent_captures
from profiler.capture.ceilings import data_dir
from profiler.errors import FusionLensError
from profiler.trace.summary import summarize, unread_line

require_router("pages/load.py")
st.title("📂 Load a trace")
st.caption("PyTorch profiler (Kineto) traces: `.json`, `.json.gz`, a `.zip` or `.tar(.gz)`, or several files "
           "for several ranks. Parsed once per content; nothing leaves this machine.")

SOURCE_KEY = "fusionlens_load_source"  # the input the person changed last: it wins over the others


def _chose(source: str) -> None:
    st.session_state[SOURCE_KEY] = source


uploads = st.file_uploader("Trace files", type=["json", "gz", "zip", "tar", "tgz"], accept_multiple_files=True,
                           key="uploads", on_change=_chose, args=("uploads",))
col_sample, col_capture, col_path = st.columns(3)
samples = sample_traces()
captures = recent_captures(data_dir() / "captures")
with col_sample:
    sample = st.selectbox("…or a bundled sample trace", ["(none)"] + [p.name for p in samples],
                          key="sample", on_change=_chose, args=("sample",))
with col_capture:
    capture = st.selectbox("…or an earlier capture", ["(none)"] + [p.name for p in captures], key="capture",
                           on_change=_chose, args=("capture",),
                           help="Runs of the Profile page, newest first (their Parquet Trace, with FLOPs, "
                                "modules and roofs)")
with col_path:
    local_path = st.text_input("…or a path on this machine", key="local_path", on_change=_chose,
                               args=("local_path",), help="A trace file, a directory, .zip or .tar(.gz) of them "
                                                          "(several ranks), or a capture's output folder")


def _try(label: str, loader, *args) -> bool:
    """Load with a spinner; bad input becomes one line, never a traceback. True when it loaded."""
    try:
        with st.spinner(f"Parsing {label}…"):
            trace = loader(*args)
    except FusionLensError as exc:
        st.error(str(exc))
        return False
    except (OSError, MemoryError) as exc:
        st.error(f"{label}: {type(exc).__name__}: {exc}")
        return False
    set_trace(trace, label)
    return True


asked = {"uploads": bool(uploads), "sample": sample != "(none)", "capture": capture != "(none)",
         "local_path": bool(local_path.strip())}
source = st.session_state.get(SOURCE_KEY)
if not asked.get(source):  # the last-changed input was cleared: the first one still filled in
    source = next((k for k, filled in asked.items() if filled), None)
loaded = None  # None: nothing asked this run; False: the asked load failed
if source == "uploads":
    blobs = [(u.name, u.getvalue()) for u in uploads]
    loaded = _try(", ".join(name for name, _ in blobs), load_uploaded, blobs)
elif source == "sample":
    path = next(p for p in samples if p.name == sample)
    loaded = _try(sample, load_paths, [str(path)])
elif source == "capture":
    folder = next(p for p in captures if p.name == capture)
    loaded = _try(f"capture {capture}", load_paths, [str(folder)])
elif source == "local_path":  # "~/traces/run.json" as a shell would read it
    loaded = _try(local_path.strip(), load_paths, [os.path.expanduser(local_path.strip())])

trace = current_trace()
if trace is None:
    st.info("No trace loaded yet.")
    st.stop()
if loaded is False:
    st.warning("Still showing the trace loaded before: " + st.session_state.get("fusionlens_trace_label", "?"))

summary = summarize(trace)
st.subheader(st.session_state.get("fusionlens_trace_label", "Trace"))
cols = st.columns(4)
cols[0].metric("Events", f"{summary['events']:,}")
cols[1].metric("Kernels", f"{summary['kernel_count']:,}")
cols[2].metric("Kernel time", lv.fmt_duration_us(summary["kernel_total_us"]),
               help="Sum of all kernel durations over every stream and rank: above the span when streams overlap")
cols[3].metric("Span", lv.fmt_duration_us(summary["span_us"]), help="First event start to last event end")
cols = st.columns(4)
ranks = list(summary["ranks"])
cols[0].metric("Ranks", len(ranks), help="rank ids: " + (", ".join(str(r) for r in ranks) or "none recorded"))
cols[1].metric("GPU streams", summary["streams"])
skipped = summary.get("skipped_reasons") or {}
cols[2].metric("Skipped events", f"{summary['skipped_events']:,}",
               help="; ".join(f"{why}: {n:,}" for why, n in skipped.items()) or "every event was kept")
unread = summary.get("unread_events") or {}
if unread:  # events of kinds FusionLens does not model (another backend's runtime, a B/E pair)
    st.caption(f"Not read: {unread_line(unread)}")
passed_over = summary["passed_over_files"]
if passed_over:  # JSON found beside the traces (a config.json): read, and not a trace
    st.caption(f"Passed over {len(passed_over)} file(s) that are not traces: " + "; ".join(passed_over[:5])
               + (" …" if len(passed_over) > 5 else ""))
if len(ranks) > 1:
    warning = lv.clock_warning(trace)
    if warning:
        st.warning(warning)
    st.markdown("**Ranks**")
    st.dataframe(lv.rank_frame(trace), hide_index=True, width="stretch")
else:
    st.caption(lv.identity_line(trace.meta))

counts = trace.events["kind"].value_counts().rename_axis("kind").reset_index(name="events")
counts = counts[counts["events"] > 0]
st.markdown("**Events by kind**")
st.dataframe(counts, hide_index=True, width="content")
top = lv.top_kernels(trace, 15)
if not top.empty:
    st.markdown("**Top kernels by total time**")
    num = st.column_config.NumberColumn
    st.dataframe(top, hide_index=True, width="stretch", height="content", column_config={
        "kernel": st.column_config.TextColumn(width=640, help="full name on hover"),
        "calls": num(format="%d", width="small"), "total (ms)": num(format="%.3f", width="small"),
        "mean (µs)": num(format="%.2f", width="small"),
        "share (%)": num(format="%.1f", width="small", help="share of the trace's total kernel time")})
