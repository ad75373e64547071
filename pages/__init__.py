"""Streamlit pages: rendering only; all computation lives in profiler/, fusion_advisor/, kernels/."""
