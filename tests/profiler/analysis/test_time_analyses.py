"""The time analyses (breakdowns, kernels, idle, launch, GPU metrics, copies) as a group: each one
runs on every committed trace, and none of them runs Python code once per event."""
from __future__ import annotations

import cProfile
import pstats

import pandas as pd
import pytest

from profiler.analysis import breakdown, gpu_metrics, idle, kernels, launch, memcpy  # noqa: F401  (registers)
from profiler.analysis.registry import ANALYSES
from tests.profiler.analysis.synth import REAL_TRACES, SynthTrace, columnar_trace, load, real_trace

TIME_ANALYSES = ("step_breakdown", "temporal", "kernel_breakdown", "kernel_launch_config_breakdown",
                 "kernel_type_breakdown", "idle_time", "launch_stats", "gpu_metrics", "memcpy_stats")


def test_all_registered():
    assert set(TIME_ANALYSES) <= set(ANALYSES)
    for name in TIME_ANALYSES:
        assert ANALYSES[name].title and ANALYSES[name].description


@pytest.mark.parametrize("name", REAL_TRACES)
def test_every_analysis_runs_on_every_trace(name):
    tr = real_trace(name)
    for analysis in TIME_ANALYSES:
        res = ANALYSES[analysis](tr)
        assert isinstance(res, (pd.DataFrame, kernels.KernelTypeBreakdown, launch.LaunchStats)), analysis
        if isinstance(res, pd.DataFrame) and analysis != "memcpy_stats":  # two traces have no copies
            assert len(res) > 0, analysis
    assert set(ANALYSES["temporal"](tr)["rank"]) == set(tr.ranks)


def python_calls(fn, *args) -> int:
    prof = cProfile.Profile()
    prof.enable()
    fn(*args)
    prof.disable()
    return pstats.Stats(prof).total_calls


@pytest.mark.parametrize("analysis", TIME_ANALYSES)
def test_python_calls_do_not_grow_with_events(analysis):
    """With 8x the events, the number of Python function calls stays flat: no per-event loop that
    calls anything (apply, iterrows, a helper or builtin per row) is hiding in the analysis."""
    small, large = columnar_trace(2_000), columnar_trace(16_000)
    fn = ANALYSES[analysis]
    python_calls(fn, small)  # warm caches (regex compilation, pandas lazy imports)
    n_small, n_large = python_calls(fn, small), python_calls(fn, large)
    assert n_large < 1.1 * n_small + 200, (n_small, n_large)


def test_cpu_only_trace(tmp_path):
    """A CPU-only capture (no kernels, no copies) gives empty or zero results, never an error."""
    t = SynthTrace()
    t.step(1, 0, 100)
    t.cpu_op("aten::mm", 5, 50)
    t.cpu_op("aten::add", 60, 10)
    tr = load(t, tmp_path)
    results = {a: ANALYSES[a](tr) for a in TIME_ANALYSES}
    step = results["step_breakdown"].iloc[0]
    assert (step["cpu_only_us"], step["idle_us"], step["kernel_us"]) == (60, 40, 0)
    assert results["temporal"]["span_us"].tolist() == [0.0]
    assert results["kernel_type_breakdown"].total_us == {"computation": 0.0, "communication": 0.0, "memory": 0.0}
    assert results["launch_stats"].launch_bound is False and results["launch_stats"].kernels == 0
    for a in ("kernel_breakdown", "idle_time", "gpu_metrics", "memcpy_stats"):
        assert len(results[a]) == 0, a
