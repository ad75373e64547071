"""Load page: upload trace files, pick a bundled sample or a local path; show the summary."""
from __future__ import annotations

import pandas as pd
import streamlit as st

from pages.state import current_trace, load_paths, load_uploaded, require_router, sample_traces, set_trace
from profiler.errors import FusionLensError
from profiler.trace.summary import summarize

require_router("pages/load.py")
st.title("📂 Load a trace")
st.caption("PyTorch profiler (Kineto) traces: `.json`, `.json.gz`, a `.zip`, or several files "
           "for several ranks. Parsed once per content; nothing leaves this machine.")

uploads = st.file_uploader("Trace files", type=["json", "gz", "zip"], accept_multiple_files=True,
                           key="uploads")
col_sample, col_path = st.columns(2)
samples = sample_traces()
with col_sample:
    sample = st.selectbox("…or a bundled sample trace", ["(none)"] + [p.name for p in samples],
                          key="sample")
with col_path:
    local_path = st.text_input("…or a path on this machine (file, directory or .zip)", key="local_path")


def _try(label: str, loader, *args) -> None:
    """Load with a spinner; bad input becomes one line, never a traceback."""
    try:
        with st.spinner(f"Parsing {label}…"):
            trace = loader(*args)
    except FusionLensError as exc:
        st.error(str(exc))
        return
    except (OSError, MemoryError) as exc:
        st.error(f"{label}: {type(exc).__name__}: {exc}")
        return
    set_trace(trace, label)


if uploads:
    blobs = [(u.name, u.getvalue()) for u in uploads]
    _try(", ".join(name for name, _ in blobs), load_uploaded, blobs)
elif sample != "(none)":
    path = next(p for p in samples if p.name == sample)
    _try(sample, load_paths, [str(path)])
elif local_path.strip():
    _try(local_path.strip(), load_paths, [local_path.strip()])

trace = current_trace()
if trace is None:
    st.info("No trace loaded yet.")
    st.stop()

summary = summarize(trace)
st.subheader(st.session_state.get("fusionlens_trace_label", "Trace"))
cols = st.columns(4)
cols[0].metric("Events", f"{summary['events']:,}")
cols[1].metric("Kernels", f"{summary['kernel_count']:,}")
cols[2].metric("Kernel time", f"{summary['kernel_total_us'] / 1e3:,.2f} ms")
cols[3].metric("Span", f"{summary['span_us'] / 1e3:,.2f} ms")
cols = st.columns(4)
ranks = list(summary["ranks"])
cols[0].metric("Ranks", len(ranks), help="rank ids: " + (", ".join(str(r) for r in ranks) or "none recorded"))
cols[1].metric("GPU streams", summary["streams"])
cols[2].metric("Skipped events", summary["skipped_events"])
devices = summary.get("devices") or []
if devices:
    st.caption("Device: " + " ".join(str(d) for d in devices))

counts = trace.events["kind"].value_counts().rename_axis("kind").reset_index(name="events")
counts = counts[counts["events"] > 0]
st.dataframe(counts, hide_index=True, width="content")
top = (trace.kernels.groupby("name", observed=True)["dur_us"].agg(["count", "sum"])
       .sort_values("sum", ascending=False).head(15).reset_index()
       .rename(columns={"sum": "total_us"}))
if not top.empty:
    st.markdown("**Top kernels by total time**")
    st.dataframe(pd.DataFrame(top), hide_index=True, width="stretch")
