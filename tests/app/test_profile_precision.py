"""The Profile page's precision controls and signals through AppTest (real tiny captures): the
autocast (AMP) choice, and the warning when a capture's steps ran on NaN."""
from __future__ import annotations

from tests.app.test_profile_page import _env, _fast, _local, _page, data_dir  # noqa: F401 (fixtures)


def test_a_capture_on_nan_weights_is_flagged(tmp_path):
    """The summary's numeric warnings (the steps ran on NaN) show above the results."""
    spec = tmp_path / "nan.py"
    spec.write_text("import torch\n\ndef build(batch=3):\n    m = torch.nn.Linear(4, 2)\n"
                    "    with torch.no_grad():\n        m.weight[0, 0] = float('nan')\n"
                    "    return m, (torch.randn(batch, 4),)\n")
    at = _local(_page(), f"{spec}:build")
    assert not at.exception and not at.error
    said = [w.value for w in at.warning]
    assert any(w.startswith("the first step's loss was nan") for w in said), said
    assert any("1 of 2 parameters hold NaN or inf (first: weight)" in w for w in said), said


def test_autocast_choice_reaches_the_capture():
    """The autocast (AMP) box: the plan, the trace's label, and bf16 GEMMs over fp32 weights."""
    at = _page()
    at.selectbox(key="profile_zoo").select("mlp")
    at.selectbox(key="profile_size").select("tiny")
    at.selectbox(key="profile_autocast").select("bfloat16")
    _fast(at)
    at.button(key="profile_run").click().run()
    assert not at.exception and not at.error
    assert at.session_state["fusionlens_trace_label"].startswith("captured: mlp (tiny), cpu/float32 + autocast bfloat16")
    trace = at.session_state["fusionlens_trace"]
    assert trace.meta["capture"]["plan"]["autocast"] == "bfloat16"
    addmm = trace.events[trace.events["name"].astype(str) == "aten::addmm"]
    assert set(addmm["input_types"].dropna().str.split(",").str[0]) == {'["c10::BFloat16"'}
