"""The Load page through streamlit's AppTest: a real run of the page script, no browser."""
from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "tests" / "data" / "traces"


@pytest.fixture(autouse=True)
def _cwd(monkeypatch):
    monkeypatch.chdir(ROOT)


def _app() -> AppTest:
    return AppTest.from_file(str(ROOT / "app.py"), default_timeout=120)


def test_starts_with_no_trace():
    at = _app().run()
    assert not at.exception
    assert any("No trace loaded" in i.value for i in at.info)


def test_sample_trace_summary_matches_raw_json():
    import gzip
    import json

    name = "tracelens_h100_bert_small.json.gz"
    raw = json.load(gzip.open(TRACES / name))["traceEvents"]
    kernels = [e for e in raw if e.get("ph") == "X" and e.get("cat") == "kernel"]

    at = _app().run()
    at.selectbox(key="sample").select(name).run()
    assert not at.exception
    assert not at.error
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Kernels"] == f"{len(kernels):,}"
    total_us = sum(e["dur"] for e in kernels)
    assert total_us < 1e3  # below a millisecond: the page says µs
    assert metrics["Kernel time"] == f"{total_us:,.2f} µs"
    assert metrics["Ranks"] == "1"  # one file, one rank: a count, not the rank id 0


def test_bad_local_path_is_one_line_error(tmp_path):
    bad = tmp_path / "broken.json"
    bad.write_text('{"traceEvents": [')
    at = _app().run()
    at.text_input(key="local_path").input(str(bad)).run()
    assert not at.exception
    assert len(at.error) == 1
    assert "broken.json" in at.error[0].value
    assert "\n" not in at.error[0].value.strip()


def test_a_local_path_under_home_takes_the_tilde(tmp_path, monkeypatch):
    """"~/..." in the path field is the home folder, as in a shell (it was "no such file")."""
    import shutil

    monkeypatch.setenv("HOME", str(tmp_path))
    shutil.copy(TRACES / "tracelens_h100_bert_small.json.gz", tmp_path / "mine.json.gz")
    at = _app().run()
    at.text_input(key="local_path").input("~/mine.json.gz").run()
    assert not at.exception and not at.error
    assert at.session_state["fusionlens_trace"] is not None
    assert at.subheader[0].value == "~/mine.json.gz"


def test_a_run_folder_with_a_config_json_loads_its_traces_and_says_what_it_passed_over(tmp_path):
    import shutil

    shutil.copy(TRACES / "tracelens_h100_bert_small.json.gz", tmp_path / "rank0.json.gz")
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    at = _app().run()
    at.text_input(key="local_path").input(str(tmp_path)).run()
    assert not at.exception and not at.error
    assert any("Passed over 1 file(s) that are not traces" in c.value and "config.json" in c.value
               for c in at.caption)


def test_an_earlier_capture_reopens_with_its_flops_modules_and_roofs(tmp_path, monkeypatch):
    """A Profile-page run saved under <data dir>/captures is offered on the Load page (newest first)
    and reopens from its Parquet Trace: FLOPs, modules and the roofs it was measured against, which
    its Kineto JSON lacks. A capture folder typed as a local path loads the same way."""
    from profiler.capture.backends import CapturePlan
    from profiler.capture.report import write_outputs
    from profiler.capture.runner import capture

    monkeypatch.setenv("FUSIONLENS_DATA_DIR", str(tmp_path))
    folder = tmp_path / "captures" / "mlp-20261201-000000"
    plan = CapturePlan(mode="infer", wait=0, warmup=0, active=1)
    write_outputs(capture("mlp", plan, folder, size="tiny"), plan, folder, "quick")
    at = _app().run()
    assert at.selectbox(key="capture").options == ["(none)", folder.name]
    at.selectbox(key="capture").select(folder.name).run()
    assert not at.exception and not at.error
    trace = at.session_state["fusionlens_trace"]
    assert trace.events["flops"].sum() > 0 and trace.events["module"].notna().any()
    assert trace.meta["capture"]["roofline_ceilings"]["source"] == "measured"
    assert at.subheader[0].value == f"capture {folder.name}"
    at.selectbox(key="capture").select("(none)").run()
    at.text_input(key="local_path").input(str(folder)).run()
    assert not at.exception and not at.error
    assert at.session_state["fusionlens_trace"].events["flops"].sum() == trace.events["flops"].sum()


def test_events_of_kinds_not_modelled_are_named_and_a_foreign_trace_is_one_line(tmp_path):
    import gzip
    import json

    doc = json.loads(gzip.decompress((TRACES / "tracelens_h100_bert_small.json.gz").read_bytes()))
    doc["traceEvents"] += [{"ph": "B", "name": "b", "pid": 1, "tid": 1, "ts": 1e3}] * 2
    (tmp_path / "mixed.json").write_text(json.dumps(doc))
    at = _app().run()
    at.text_input(key="local_path").input(str(tmp_path / "mixed.json")).run()
    assert not at.exception and not at.error
    assert any('Not read: 2 events of kinds FusionLens does not model (ph "B" events x2)' in c.value
               for c in at.caption)
    (tmp_path / "jax.json").write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "fusion", "pid": 1,
                                                                    "tid": 1, "ts": 1, "dur": 2}]}))
    at.text_input(key="local_path").input(str(tmp_path / "jax.json")).run()
    assert not at.exception
    assert [e.value for e in at.error] == [f"{tmp_path / 'jax.json'}: not a PyTorch profiler (Kineto) trace: its "
                                           "one event is not of a kind FusionLens reads (seen: (no category) x1)"]
