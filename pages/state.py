"""Session-level helpers shared by the pages: the loaded Trace and cached parsing.

Parsing is cached by content hash (sha256 of the uploaded bytes), so reruns and page switches
never parse the same bytes twice.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import streamlit as st

from profiler.trace import Trace, load_trace

TRACE_KEY = "fusionlens_trace"
SAMPLES_DIR = Path(__file__).resolve().parent.parent / "tests" / "data" / "traces"


def content_hash(blobs: list[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for name, data in blobs:
        h.update(name.encode())
        h.update(hashlib.sha256(data).digest())
    return h.hexdigest()


@st.cache_resource(max_entries=8, show_spinner=False)
def _load_blobs(key: str, _blobs: tuple[tuple[str, bytes], ...]) -> Trace:
    """Parse uploaded files once per content hash `key` (the blobs themselves are not hashed again)."""
    from io import BytesIO

    sources = []
    for name, data in _blobs:
        buf = BytesIO(data)
        buf.name = name  # the loader names the file in its messages and sniffs .gz/.zip
        sources.append(buf)
    return load_trace(sources if len(sources) > 1 else sources[0])


@st.cache_resource(max_entries=8, show_spinner=False)
def _load_paths(paths: tuple[str, ...], mtimes: tuple[float, ...]) -> Trace:
    from profiler.capture.artifacts import load_traces_or_saved

    return load_traces_or_saved(list(paths))  # a capture's folder: its Parquet Trace (FLOPs, modules, roofs)


def load_uploaded(blobs: list[tuple[str, bytes]]) -> Trace:
    return _load_blobs(content_hash(blobs), tuple(blobs))


def load_paths(paths: list[str]) -> Trace:
    """Trace files, a directory, .zip or .tar(.gz) of them, or a saved capture folder (cached per path and mtime)."""
    mtimes = tuple(_mtime(Path(p)) for p in paths)
    return _load_paths(tuple(paths), mtimes)


def _mtime(p: Path) -> float:
    """A path's mtime; a saved Trace folder's is its meta.json's (rewritten with every save)."""
    from profiler.capture.artifacts import saved_trace_folder

    saved = saved_trace_folder(p)
    target = saved / "meta.json" if saved is not None else p
    return target.stat().st_mtime if target.exists() else 0.0


def current_trace() -> Trace | None:
    return st.session_state.get(TRACE_KEY)


def set_trace(trace: Trace, label: str) -> None:
    st.session_state[TRACE_KEY] = trace
    st.session_state[TRACE_KEY + "_label"] = label


def sample_traces() -> list[Path]:
    return sorted(SAMPLES_DIR.glob("*.json.gz")) if SAMPLES_DIR.is_dir() else []


# ------------------------------------------------------------------ routing through app.py
ROUTER_KEY = TRACE_KEY + "_router_ran"
WANTED_KEY = TRACE_KEY + "_wanted_page"


def mark_router() -> None:
    """app.py calls this on every run, before st.navigation: the pages know the router ran."""
    st.session_state[ROUTER_KEY] = True


def require_router(page: str) -> None:
    """Send a page that runs without app.py through the router, then back to `page`.

    Streamlit sees the `pages/` folder and, until app.py's st.navigation has run once in the
    server, serves a deep link (`/profile` on a fresh server) the MPA-v1 way: the page script alone,
    without app.py's page config and navigation. Redirect to app.py, which resumes `page`.
    """
    if not st.session_state.get(ROUTER_KEY):
        st.session_state[WANTED_KEY] = page
        st.switch_page("app.py")


def resume_wanted_page() -> None:
    """app.py calls this after st.navigation: go to the page a deep link asked for, once."""
    wanted = st.session_state.pop(WANTED_KEY, None)
    if wanted:
        st.switch_page(wanted)
