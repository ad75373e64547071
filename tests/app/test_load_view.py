"""The Load page's pure helpers (pages/load_view.py) against numbers recomputed from the raw JSON,
and the page's multi-rank, stale-trace and units behaviour through AppTest."""
from __future__ import annotations

import gzip
import json
import math
import shutil
from collections import defaultdict
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from pages import load_view as lv
from profiler.trace import load_trace

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests" / "data" / "traces"
RANK0 = TRACES / "hta_a100_rank0of2_nccl_data.json.gz"  # rank 0 of one run (A100)
RANK1 = TRACES / "hta_v100_rank1of2_trace_diff_test.json.gz"  # rank 1 of another run (V100), other clock


def _raw_kernels(path: Path) -> list[dict]:
    events = json.load(gzip.open(path))["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel"]


@pytest.mark.parametrize("us, text", [
    (None, "-"), (float("nan"), "-"), (0.0, "0 µs"), (1.76, "1.76 µs"), (999.994, "999.99 µs"),
    (1_000.0, "1.00 ms"), (12_549.021, "12.55 ms"), (13_336_320.0, "13.336 s"), (90e6, "1.50 min"),
    (2.5 * 3_600e6, "2.50 h"), (3 * 86_400e6, "3.0 days")])
def test_fmt_duration_us(us, text):
    assert lv.fmt_duration_us(us) == text


def test_device_names_and_identity_line():
    props = [{"name": "A"}, {"name": "A"}, {"name": "B"}, {"name": ""}, {}]
    assert lv.device_names(props) == "A x2, B"
    assert lv.device_names([{"name": ""}]) == "" and lv.device_names(None) == ""
    line = lv.identity_line({"ranks": (1,), "distributed_info": {"world_size": 2},
                             "device_properties": [{"name": "V100"}] * 2})
    assert line.startswith("Rank 1 of 2") and line.endswith("Device: V100 x2")
    assert lv.identity_line({"ranks": (0,), "distributed_info": {"world_size": 1}, "device_properties": []}) \
        == "Device: not recorded in the trace (deviceProperties has no names)"


def test_top_kernels_match_raw_json():
    path = TRACES / "tracelens_mi300x_torch_compile_triton.json.gz"
    raw = _raw_kernels(path)
    by_name: dict[str, list[float]] = defaultdict(list)
    for e in raw:
        by_name[e["name"]].append(float(e["dur"]))
    total = sum(sum(d) for d in by_name.values())
    want = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:5]

    top = lv.top_kernels(load_trace(str(path)), 5)
    assert list(top["kernel"]) == [name for name, _ in want]
    for (_, durs), row in zip(want, top.itertuples(index=False)):
        assert row[1] == len(durs)
        assert math.isclose(row[2], sum(durs) / 1e3, rel_tol=1e-9)
        assert math.isclose(row[3], sum(durs) / len(durs), rel_tol=1e-9)
        assert math.isclose(row[4], 100 * sum(durs) / total, rel_tol=1e-9)


def test_ranks_from_two_runs_warn_and_tabulate():
    trace = load_trace([str(RANK0), str(RANK1)])
    warning = lv.clock_warning(trace)
    assert warning and warning.startswith("Ranks 0 and 1 never overlap in time") and "\n" not in warning
    frame = lv.rank_frame(trace).set_index("rank")
    assert frame.loc[0, "kernels"] == len(_raw_kernels(RANK0))
    assert frame.loc[1, "kernels"] == len(_raw_kernels(RANK1))
    assert frame.loc[0, "file"] == RANK0.name and frame.loc[1, "device"] == "Tesla V100-SXM2-16GB x2"
    assert list(frame["world size"]) == ["2", "2"]


def test_ranks_on_one_clock_do_not_warn():
    same = str(TRACES / "tracelens_h100_bert_small.json.gz")
    assert lv.clock_warning(load_trace([same, same], rank=[0, 1])) is None
    assert lv.clock_warning(load_trace(same)) is None


# ---------------------------------------------------------------- the page
@pytest.fixture(autouse=True)
def _cwd(monkeypatch):
    monkeypatch.chdir(ROOT)


def _app() -> AppTest:
    return AppTest.from_file(str(ROOT / "app.py"), default_timeout=120).run()


def test_page_shows_two_runs_warning_and_rank_table(tmp_path):
    folder = tmp_path / "ranks"
    folder.mkdir()
    for p in (RANK0, RANK1):
        shutil.copy(p, folder / p.name)
    at = _app()
    at.text_input(key="local_path").input(str(folder)).run()
    assert not at.exception and not at.error
    assert len(at.warning) == 1 and "never overlap in time" in at.warning[0].value
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Ranks"] == "2" and metrics["Span"].endswith(" days")
    ranks = [d.value for d in at.dataframe if "rank" in d.value.columns]
    assert len(ranks) == 1 and list(ranks[0]["rank"]) == [0, 1]


def test_failed_load_says_the_old_trace_is_still_shown(tmp_path):
    good = TRACES / "tracelens_mi300x_torch_compile_triton.json.gz"
    bad = tmp_path / "bad.json"
    bad.write_text('{"hello": 1}')
    at = _app()
    at.text_input(key="local_path").input(str(good)).run()
    assert not at.error and not at.warning
    at.text_input(key="local_path").input(str(bad)).run()
    assert not at.exception
    assert len(at.error) == 1 and "bad.json" in at.error[0].value
    assert len(at.warning) == 1 and at.warning[0].value.endswith(str(good))
    caption = " ".join(c.value for c in at.caption)
    assert "Device: AMD Instinct MI300X" in caption


def test_tiny_kernel_time_is_not_rounded_to_zero():
    at = _app()
    at.selectbox(key="sample").select("hta_a100_triton_example.json.gz").run()
    kernels = _raw_kernels(TRACES / "hta_a100_triton_example.json.gz")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Kernel time"] == f"{sum(e['dur'] for e in kernels):,.2f} µs" != "0.00 µs"


def test_the_input_changed_last_wins():
    """A sample picked, then a path typed: the path loads (it used to be ignored while a sample was set),
    and picking a sample again brings the sample back."""
    first, second = "tracelens_h100_bert_small.json.gz", TRACES / "tracelens_mi300x_torch_compile_triton.json.gz"
    at = _app()
    at.selectbox(key="sample").select(first).run()
    assert at.session_state["fusionlens_trace_label"] == first
    at.text_input(key="local_path").input(str(second)).run()
    assert not at.exception and at.session_state["fusionlens_trace_label"] == str(second)
    assert {m.label: m.value for m in at.metric}["Kernels"] == str(len(_raw_kernels(second)))
    at.selectbox(key="sample").select("hta_a100_triton_example.json.gz").run()
    assert at.session_state["fusionlens_trace_label"] == "hta_a100_triton_example.json.gz"
    at.selectbox(key="sample").select("(none)").run()  # cleared: the path, still filled in, is what shows
    assert at.session_state["fusionlens_trace_label"] == str(second)
