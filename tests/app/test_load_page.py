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
