"""The contract for a damaged folder a person opens by path (a saved Trace, a folder of ranks)."""
from __future__ import annotations

from typing import Optional

from profiler.capture.artifacts import load_traces_or_saved
from profiler.errors import FusionLensError
from tests.profiler.trace.fuzz_ingest import check_loaded


def open_damaged(folder) -> tuple[Optional[str], object]:
    """(message, None) when the folder is refused, after checking the message is one short line;
    (None, trace) when it loads, after checking every analysis reads the Trace."""
    try:
        trace = load_traces_or_saved([str(folder)])
    except FusionLensError as exc:
        msg = str(exc)
        assert "\n" not in msg and 0 < len(msg) < 400, msg
        return msg, None
    problem = check_loaded(trace)
    assert problem is None, problem
    return None, trace
