"""The Profile page through streamlit's AppTest (real captures of tiny models, no browser), and the
pure helpers behind it (pages/profile_view.py)."""
from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pandas as pd
import pytest
import torch
from streamlit.testing.v1 import AppTest

from pages import profile_view as pv
from profiler.capture.zoo import zoo_config, zoo_models
from profiler.trace.model import Trace

ROOT = Path(__file__).resolve().parents[2]
PAGE = "pages/profile.py"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """One data dir per module (per xdist worker): the quick CPU ceilings are measured once."""
    return tmp_path_factory.mktemp("fl_data")


@pytest.fixture(autouse=True)
def _env(monkeypatch, data_dir):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("FUSIONLENS_DATA_DIR", str(data_dir))


def _page() -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120).run()
    at.switch_page(PAGE).run()
    assert not at.exception
    return at


def _fast(at: AppTest) -> None:
    """Tiny runs: 1 active step, no unprofiled wait, quick ceilings."""
    at.number_input(key="profile_wait").set_value(0)
    at.number_input(key="profile_active").set_value(1)
    at.selectbox(key="profile_ceilings").select("quick")


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def _local(at: AppTest, spec: str) -> AppTest:
    at.radio(key="profile_kind").set_value("local").run()
    at.text_input(key="profile_spec").input(spec)
    _fast(at)
    return at.button(key="profile_run").click().run()


def test_page_renders_zoo_from_registry_and_sources_panel():
    at = _page()
    assert at.title[0].value.endswith("Profile a model")
    options = at.selectbox(key="profile_zoo").options  # "name: description" labels
    assert [o.split(":")[0] for o in options] == sorted(zoo_models())
    sources = at.table[0].value.set_index("source")
    for label in ("NVML counters", "CUPTI tracer"):  # off on any machine for a cpu Kineto capture
        assert sources.loc[label, "state"].endswith("off") and sources.loc[label, "reason"].strip()
    assert sources.loc["Kineto (torch.profiler)", "state"].endswith(" on")
    if not torch.cuda.is_available():
        assert "CPU-only build" in sources.loc["CUDA", "reason"] or "no CUDA device" in sources.loc["CUDA", "reason"]
    assert any("Pick a model" in i.value for i in at.info)


def _plotly_array(value) -> list:
    """A plotly JSON array: a list, or a typed array {'dtype': 'f8', 'bdata': base64} (numpy input)."""
    if isinstance(value, dict):
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).tolist()
    return list(value)


def _check_roofline_chart(at: AppTest, folder: Path, table: str = "roofline.csv") -> None:
    """One plotly chart: the run's roofs (summary.json) and one marker per row of `table` (op types,
    or modules for roofline_modules.csv) that has positive, finite intensity and FLOP/s (the rest
    are counted in the subtitle)."""
    import plotly.io as pio

    (chart,) = at.get("plotly_chart")
    fig = pio.from_json(chart.proto.spec)
    used = json.loads((folder / "summary.json").read_text())["roofline_ceilings"]
    peak, bw = used["peak_flops_per_s"]["fp32"], used["mem_bw_bytes_per_s"]
    slope, flat = fig.data[0], fig.data[1]
    assert flat.y[0] == pytest.approx(peak / 1e9) and slope.x[-1] == pytest.approx(peak / bw)
    csv = pd.read_csv(folder / table)
    ok = (csv["flops"] > 0) & (csv["bytes_moved"] > 0)
    marks = [t for t in fig.data if t.name.endswith("-bound")]
    got = sorted(x for t in marks for x in _plotly_array(t.x))
    assert got == pytest.approx(sorted(csv.loc[ok, "flops"] / csv.loc[ok, "bytes_moved"]))
    assert fig.layout.xaxis.type == fig.layout.yaxis.type == "log"
    assert f"{int(ok.sum())} shown" in fig.layout.title.subtitle.text


@pytest.mark.parametrize("mode", ["infer", "train"])
def test_zoo_capture_becomes_current_trace(mode, data_dir):
    at = _page()
    at.selectbox(key="profile_zoo").select("mlp")
    at.selectbox(key="profile_size").select("tiny")
    at.radio(key="profile_mode").set_value(mode)
    _fast(at)
    at.button(key="profile_run").click().run()
    assert not at.exception and not at.error

    trace = at.session_state["fusionlens_trace"]
    assert isinstance(trace, Trace) and trace.meta["capture"]["spec"] == "mlp"
    assert at.session_state["fusionlens_trace_label"].startswith("captured: mlp (tiny), cpu/float32, " + mode)

    # the numbers on the page, recomputed from the raw Kineto JSON the run wrote
    (folder,) = [p for p in (data_dir / "captures").iterdir() if p.name.startswith("mlp-")
                 and json.loads((p / "summary.json").read_text())["plan"]["mode"] == mode]
    raw = json.loads((folder / "kineto_rank0.pt.trace.json").read_text())["traceEvents"]
    steps = [e["dur"] for e in raw if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    ops = [e for e in raw if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    m = _metrics(at)
    assert m["Profiled steps"] == str(len(steps)) == "1"
    assert m["Median step time"] == f"{statistics.median(steps) / 1e3:,.3f} ms"
    assert m["CPU ops"] == f"{len(ops):,}"

    # roofline: the two Linear layers' addmm, hand-counted from the tiny preset
    cfg = zoo_config("mlp", "tiny")
    b, f, h, o = cfg.batch, cfg.features, cfg.hidden, cfg.outputs
    roof = next(d.value for d in at.dataframe if "headroom (µs)" in d.value.columns)
    assert list(roof["headroom (µs)"]) == sorted(roof["headroom (µs)"], reverse=True)
    addmm = roof[roof["op"] == "aten::addmm"].iloc[0]
    assert addmm["FLOPs"] == 2 * b * (f * h + h * o)
    assert addmm["bytes (algorithmic lower bound)"] == 4 * ((h + b * f + f * h + b * h) + (o + b * h + h * o + b * o))
    _check_roofline_chart(at, folder)
    files = next(t.value for t in at.table if "path" in t.value.columns)
    assert all(Path(p).exists() for p in files["path"])
    # per module: each Linear's own ops, its backward included in training (the cost pass's ModuleTracker)
    by_module = next(d.value for d in at.dataframe if "module" in d.value.columns).set_index("module")["FLOPs"]
    first, second = by_module["Sequential.0"], by_module["Sequential.2"]
    if mode == "infer":
        assert (first, second) == (2 * b * f * h, 2 * b * h * o)
    else:  # + weight grad (input needs none) / + input and weight grads, + the bias grads' sums
        assert (first, second) == (2 * (2 * b * f * h) + b * h, 3 * (2 * b * h * o) + b * o)
    assert {b.label for b in at.get("download_button")} == {"Download roofline CSV", "Download per-module roofline CSV",
                                                           "Download summary JSON"}
    at.radio(key="profile_roofline_points").set_value("modules").run()  # one marker per module
    assert not at.exception
    _check_roofline_chart(at, folder, "roofline_modules.csv")
    assert "Roofline: every module" in str(at.get("plotly_chart")[0].proto.spec)
    # summed to depth 1: the whole Sequential, its layers' FLOPs together
    assert at.selectbox(key="profile_module_depth").options == ["own ops", "summed to depth 1 (with their children)"]
    at.selectbox(key="profile_module_depth").set_value(1).run()
    assert not at.exception
    whole = next(d.value for d in at.dataframe if "module" in d.value.columns).set_index("module")["FLOPs"]
    assert list(whole.index) == ["Sequential"] and whole["Sequential"] == by_module.sum()

    at.switch_page("pages/load.py").run()  # the Load page shows the captured trace
    assert not at.exception
    assert at.subheader[0].value.startswith("captured: mlp")
    assert _metrics(at)["Events"] == f"{len(trace.events):,}"
    assert not at.error and not at.warning
    assert any(c.value == "Device: cpu (captured on this machine by FusionLens)" for c in at.caption)


BAD_SPECS = {
    "raises.py": ("def build():\n    raise ValueError('bad config 42')\n", "bad config 42"),
    "wrong.py": ("def build():\n    return 3\n", "must return (model, inputs)"),
    "oom.py": ("def build():\n    raise MemoryError('simulated')\n", "ran out of memory"),
    # what the kernel's OOM killer does to a capture that outgrows the machine (the server lives on)
    "killed.py": ("import os, signal\n\ndef build():\n    os.kill(os.getpid(), signal.SIGKILL)\n",
                  "ran out of memory: the capture process was killed (SIGKILL)"),
    "segfault.py": ("import ctypes\n\ndef build():\n    ctypes.string_at(0)\n", "the capture process died of SIGSEGV"),
}
if not torch.cuda.is_available():  # a build that needs a GPU, here
    BAD_SPECS["cuda.py"] = ("import torch\n\ndef build():\n    return torch.nn.Linear(2, 2).to('cuda'), (torch.randn(1, 2),)\n",
                            "build() raised")


def _folders(data_dir: Path) -> set[str]:
    captures = data_dir / "captures"
    return {p.name for p in captures.iterdir()} if captures.is_dir() else set()


def test_bad_specs_give_one_line_then_a_good_run_works(tmp_path, data_dir):
    before = _folders(data_dir)
    at = _page()
    cases = [(f"{tmp_path / name}:build", cause) for name, (_, cause) in BAD_SPECS.items()]
    for name, (code, _) in BAD_SPECS.items():
        (tmp_path / name).write_text(code)
    cases += [(f"{tmp_path / 'missing.py'}:build", "file not found"),
              ("fl_no_such_package.models:build", "no module named"),
              ("mlp-typo", "not a zoo model")]
    for spec, cause in cases:
        _local(at, spec)
        assert not at.exception
        assert len(at.error) == 1, spec
        line = at.error[0].value
        assert f"spec {spec!r}" in line and cause in line and "\n" not in line
    assert _folders(data_dir) == before  # no empty `<spec>-<time>` folder left per failed attempt
    good = tmp_path / "good.py"
    good.write_text("import torch\n\ndef build(batch=3):\n"
                    "    return torch.nn.Linear(5, 2), (torch.randn(batch, 5),)\n")
    _local(at, f"{good}:build")
    assert not at.exception and not at.error
    assert _metrics(at)["Profiled steps"] == "1"
    assert at.session_state["fusionlens_trace_label"].startswith(f"captured: {good}:build, cpu/float32")


def test_local_spec_takes_build_keywords_and_batch(tmp_path):
    """The local spec's keyword field reaches build() as the CLI's --set does, the Batch field as
    batch=; a keyword build() cannot take is one line naming its parameters."""
    spec = tmp_path / "sized.py"
    spec.write_text("import torch\n\ndef build(batch=3, width=5):\n"
                    "    return torch.nn.Linear(width, 2), (torch.randn(batch, width),)\n")
    at = _page()
    at.radio(key="profile_kind").set_value("local").run()
    at.text_input(key="profile_spec_settings").input("width=7")
    at.number_input(key="profile_batch").set_value(4)
    _local(at, f"{spec}:build")
    assert not at.exception and not at.error
    ev = at.session_state["fusionlens_trace"].events
    dims = ev.loc[ev["name"].astype(str) == "aten::addmm", "input_dims"].dropna().astype(str)
    assert dims.str.contains(r"\[4,7\]", regex=True).all() and len(dims)
    at.text_input(key="profile_spec_settings").input("depth=2")
    _local(at, f"{spec}:build")
    assert len(at.error) == 1 and "does not take 'depth' (its parameters: batch, width)" in at.error[0].value


def test_device_and_backend_choices_follow_this_machine():
    at = _page()
    cuda_ok = torch.cuda.is_available()
    assert at.selectbox(key="profile_device").options == (["cpu", "cuda"] if cuda_ok else ["cpu"])
    if not cuda_ok:  # cuda is shown, disabled, with the reason
        toggle = at.toggle(key="profile_cuda_off")
        assert toggle.disabled and not toggle.value and toggle.help.strip()
    from profiler.capture.backends import available_backends

    backends = available_backends()
    assert at.selectbox(key="profile_backend").options[0] == "kineto"
    assert set(at.selectbox(key="profile_backend").options) == {b for b, r in backends.items() if r is None}
    for name, reason in backends.items():
        if reason:
            assert any(c.value == f"🚫 backend {name} is off: {reason}" for c in at.caption)


def test_choice_helpers():
    assert pv.device_options({"cuda": "no GPU"}) == {"cpu": None, "cuda": "no GPU"}
    assert pv.usable(pv.device_options({"cuda": "no GPU"})) == ["cpu"]
    assert pv.usable({"cupti": None, "kineto": None, "x": "off"}) == ["kineto", "cupti"]


# ---------------------------------------------------------------- pure helpers
def test_parse_settings():
    assert pv.parse_settings("layers=2, dim=64\nname=x, lr=0.5, tie=false") == \
        {"layers": 2, "dim": 64, "name": "x", "lr": 0.5, "tie": False}
    assert pv.parse_settings(" ") == {}
    # space-separated, as people type them (it read {'layers': '2 dim=64'}), and spaces around '='
    assert pv.parse_settings("layers=2 dim=64") == pv.parse_settings("layers = 2,dim= 64") == {"layers": 2, "dim": 64}
    for bad in ("layers", "=3", "2x=1", "a="):
        with pytest.raises(pv.ProfileInputError, match="KEY=VALUE"):
            pv.parse_settings(bad)


def test_make_request_validates():
    kw = dict(size="tiny", batch=None, settings="", device="cpu", dtype="float32", mode="infer", wait=0,
              warmup=1, active=1, backend="kineto", ceilings="quick", heavy={"with_stack": True})
    req = pv.make_request(" mlp ", **kw)
    assert req.spec == "mlp" and req.plan.with_stack and not req.plan.profile_memory and req.spec_kind == "zoo"
    with pytest.raises(pv.ProfileInputError, match="no model spec"):
        pv.make_request("  ", **kw)
    with pytest.raises(pv.ProfileInputError, match=r"spec 'mlp': active steps must be an integer in \[1, 10000\], got 0"):
        pv.make_request("mlp", **{**kw, "active": 0})
    with pytest.raises(pv.ProfileInputError, match=r"spec 'mlp': a 2-rank \(DDP\) capture profiles training"):
        pv.make_request("mlp", **kw, nproc=2)
    with pytest.raises(pv.ProfileInputError, match="spec 'mlp': ranks must be a positive integer"):
        pv.make_request("mlp", **kw, nproc=0)
    assert pv.make_request("mlp", **{**kw, "mode": "train"}, nproc=2).label.endswith(", train, 2 ranks (DDP), 1 active step(s)")


def test_ddp_capture_from_the_page(data_dir):
    """Ranks 2: a real gloo DDP run of two processes; the trace has both ranks, the distributed
    analyses see each rank's all-reduces, the numbers match the two raw Kineto files."""
    from profiler.analysis.distributed import collectives

    at = _page()
    at.selectbox(key="profile_zoo").select("mlp")
    at.selectbox(key="profile_size").select("tiny")
    at.radio(key="profile_mode").set_value("train")
    at.number_input(key="profile_nproc").set_value(2)
    _fast(at)
    at.button(key="profile_run").click().run()
    assert not at.exception and not at.error
    trace = at.session_state["fusionlens_trace"]
    assert trace.ranks == (0, 1)
    assert at.session_state["fusionlens_trace_label"] == "captured: mlp (tiny), cpu/float32, train, 2 ranks (DDP), 1 active step(s)"
    (folder,) = [p for p in (data_dir / "captures").iterdir() if p.name.startswith("mlp-")
                 and (p / "summary.json").is_file()  # a failed run leaves a folder without one
                 and json.loads((p / "summary.json").read_text()).get("nproc") == 2]
    raw = [json.loads((folder / f"kineto_rank{r}.pt.trace.json").read_text())["traceEvents"] for r in (0, 1)]
    assert _metrics(at)["CPU ops"] == f"{sum(1 for ev in raw for e in ev if e.get('ph') == 'X' and e.get('cat') == 'cpu_op'):,}"
    assert json.loads((folder / "summary.json").read_text())["nproc"] == 2
    coll = collectives(trace)
    for r in (0, 1):
        n = sum(1 for e in raw[r] if e.get("ph") == "X" and str(e.get("name", "")).startswith("gloo:"))
        assert n >= 1 and int(coll.loc[coll["rank"] == r, "count"].sum()) == n


def test_error_line_is_one_line_naming_the_spec():
    assert pv.error_line("a.py:build", OSError(2, "No such file")) == "spec 'a.py:build': FileNotFoundError: [Errno 2] No such file"
    assert pv.error_line("m", MemoryError()).startswith("spec 'm': ran out of memory")
    assert pv.error_line("m", ValueError("spec 'm': two\nlines")) == "spec 'm': two lines"
    assert pv.error_line("", ValueError("no model spec")) == "no model spec"


def test_roofline_frame_known_answers():
    # op a: 1e9 FLOP, 1e8 B in 1000 us; at roof (peak 1e12, bw 1e10): max(1 ms, 10 ms) = 10 ms
    csv = pd.DataFrame({"kind": ["cpu_op"] * 2, "name": ["a", "b"], "dtype": ["fp32"] * 2, "count": [1, 2],
                        "dur_us": [20_000.0, 100.0], "flops": [1e9, 0.0], "bytes_moved": [1e8, 1e6],
                        "time_at_roof_us": [10_000.0, 100.0], "headroom_us": [10_000.0, 0.0],
                        "peak_flops_per_s": [1e12] * 2, "algorithmic_intensity_flop_per_byte": [10.0, 0.0],
                        "achieved_flops_per_s": [5e10, 0.0], "achieved_bytes_per_s": [5e9, 1e10],
                        "bound": ["memory", "memory"], "pct_of_roof": [50.0, 100.0]})
    out = pv.roofline_frame(csv.iloc[::-1], top=1)
    assert len(out) == 1 and out.loc[0, "op"] == "a"
    assert out.loc[0, "roof GFLOP/s"] == 100.0  # min(1e12, 10 FLOP/B x 1e10 B/s) = 1e11
    assert out.loc[0, "achieved GFLOP/s"] == 50.0 and out.loc[0, "% of roof"] == 50.0
    assert pd.isna(pv.roofline_frame(csv).loc[1, "roof GFLOP/s"])  # no FLOPs: no FLOP/s roof
    assert pv.roofline_frame(None).empty


def test_summary_metrics_format():
    m = dict(pv.summary_metrics({"profiled_steps": 3, "step_time_us_median": 1500.0, "events_by_kind": {"cpu_op": 12},
                                 "events": 20, "flops_total": 2.5e9, "bytes_moved_total": 1234.0,
                                 "timings_s": {"total_s": 2.0}}))
    assert m["Median step time"] == "1.500 ms" and m["FLOPs counted"] == "2.5 GFLOP"
    assert m["Bytes (algorithmic lower bound)"] == "1.23 kB" and m["GPU kernels"] == "0"
    assert m["FLOPs pass joined"] == "-"  # no FLOPs pass


def test_join_coverage_of_one_rank_and_of_several():
    one = {"capture": {"join": {"recorded_ops": 1440, "matched_ops": 1440}}}
    assert pv.join_coverage(one) == "100.0%"
    ranks = {"capture": {"join_per_rank": {"0": {"recorded_ops": 903, "matched_ops": 870},
                                           "1": {"recorded_ops": 903, "matched_ops": 870}}}}
    assert pv.join_coverage(ranks) == "96.3%"


def test_ceilings_note():
    used = {"source": "measured", "peak_flops_per_s": {"fp32": 1.5e11, "bf16": 3e11}, "mem_bw_bytes_per_s": 4e10,
            "details": {"mode": "quick", "cache": "hit"}}
    assert pv.ceilings_note(used, "bfloat16") == \
        "Ceilings: measured (quick, cache hit): peak 300 GFLOP/s (bf16), bandwidth 40 GB/s."
    assert pv.ceilings_note(None, "float32") == "Ceilings: none recorded."
    assert pv.ceilings_note(used, "float16") == (  # CPU ceilings have no fp16 peak: the roof is fp32's
        "Ceilings: measured (quick, cache hit): peak 150 GFLOP/s (fp32's: no fp16 peak measured), bandwidth 40 GB/s.")
    used["details"]["remeasured_because"] = "aten::mm ran at 140 GFLOP/s, above the cached fp32 roof 27 GFLOP/s"
    assert pv.ceilings_note(used, "float32").endswith(
        "bandwidth 40 GB/s. Re-measured for this capture: aten::mm ran at 140 GFLOP/s, above the cached fp32 roof 27 GFLOP/s.")


def test_hf_offered_only_with_transformers():
    from profiler.capture.hf import transformers_unavailable_reason

    reason = transformers_unavailable_reason()
    kinds = {k.kind: k for k in pv.model_kinds()}
    assert kinds["hf"].reason == reason and kinds["zoo"].reason is None
    at = _page()
    assert (pv.KIND_LABELS["hf"] in at.radio(key="profile_kind").options) == (reason is None)
    if reason is not None:
        assert any(reason in c.value for c in at.caption)
        return
    names = list(pv.hf_choices())
    assert names[:3] == ["bert", "gpt2", "llama"]  # the written-out ones first, then transformers' text LMs
    assert pv.hf_choices()["mistral"][0] == "CausalLM from transformers' mistral config" and "vit" not in names


def test_run_profile_progress_and_files(tmp_path):
    seen = []
    req = pv.make_request("mlp", size="tiny", batch=2, settings="hidden=8", device="cpu", dtype="float32",
                          mode="infer", wait=0, warmup=1, active=2, backend="kineto", ceilings="none", heavy={})
    out = pv.run_profile(req, tmp_path, lambda d, t, m: seen.append((d, t, m)))
    assert seen[0][0] == 0 and seen[-1][0] == seen[-1][1] == req.plan.steps == 3
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)  # the bar never goes back
    assert out.out_dir.parent == tmp_path and (out.out_dir / "summary.json").is_file()
    assert json.loads(out.summary_json)["profiled_steps"] == 2
    assert out.roofline is None and out.summary["roofline_missing"] == "roofline turned off (--ceilings none)"
    addmm = out.trace.events[out.trace.events["name"] == "aten::addmm"]
    assert set(addmm["flops"]) == {2 * 2 * 8 * 8, 2 * 2 * 8 * 4}  # batch 2, features 8 -> hidden 8 -> outputs 4
    assert pv.CAPTURE_LOCK.acquire(blocking=False)  # another session's capture is running
    try:
        with pytest.raises(pv.ProfileInputError, match="spec 'mlp': another capture is running in this server"):
            pv.run_profile(req, tmp_path)
    finally:
        pv.CAPTURE_LOCK.release()
    with pytest.raises(pv.ProfileInputError, match="device cuda is unavailable here: no GPU"):
        pv.run_profile(pv.ProfileRequest("mlp", dataclasses.replace(req.plan, device="cuda")), tmp_path,
                       env={"cuda": "no GPU", "backend:kineto": None})


@pytest.mark.skipif(pv.model_kinds()[1].reason is not None, reason="transformers is not installed (optional extra)")
def test_hf_capture_from_the_page():
    at = _page()
    at.radio(key="profile_kind").set_value("hf").run()
    box = at.selectbox(key="profile_hf")
    box.select_index([o.split(":")[0] for o in box.options].index("gpt2"))
    at.selectbox(key="profile_size").select("tiny")
    at.radio(key="profile_mode").set_value("infer")
    _fast(at)
    at.button(key="profile_run").click().run()
    assert not at.exception and not at.error
    assert at.session_state["fusionlens_trace"].meta["capture"]["spec"] == "hf:gpt2"
    assert _metrics(at)["Profiled steps"] == "1"


def test_settings_hint_is_each_presets_own_valid_settings():
    """The greyed hint lists the chosen preset's settings (it said 'layers=2, dim=64' for every model,
    which mlp, cnn and vit reject): each hint parses and, fed back, gives the preset's own config."""
    for name, (_, sizes) in pv.zoo_choices().items():
        for size in sizes:
            values = pv.preset_values("zoo", name, size)
            hint = pv.settings_hint(values)
            assert "batch=" not in hint and hint
            assert zoo_config(name, size, **pv.parse_settings(hint)) == zoo_config(name, size)
            assert values["batch"] == zoo_config(name, size).batch


def test_page_hints_follow_the_chosen_model():
    at = _page()
    at.selectbox(key="profile_zoo").select("mlp").run()
    at.selectbox(key="profile_size").select("tiny").run()
    tiny = zoo_config("mlp", "tiny")
    assert at.text_input(key="profile_settings").placeholder == (
        f"features={tiny.features}, hidden={tiny.hidden}, depth={tiny.depth}, outputs={tiny.outputs}")
    assert at.number_input(key="profile_batch").placeholder == f"preset ({tiny.batch})"


def test_roofline_chart_only_with_a_table_and_its_ceilings():
    csv = pd.DataFrame({"kind": ["cpu_op"], "name": ["aten::mm"], "dtype": ["bf16"], "count": [2], "dur_us": [10.0],
                        "flops": [2e6], "bytes_moved": [1e5], "algorithmic_intensity_flop_per_byte": [20.0],
                        "achieved_flops_per_s": [2e11], "bound": ["compute"], "pct_of_roof": [50.0],
                        "headroom_us": [5.0]})
    used = {"peak_flops_per_s": {"fp32": 1e12}, "mem_bw_bytes_per_s": 1e11, "source": "measured"}
    assert pv.roofline_chart(None, used, "float32") is None
    assert pv.roofline_chart(csv.iloc[:0], used, "float32") is None
    assert pv.roofline_chart(csv, None, "float32") is None
    fig = pv.roofline_chart(csv, used, "bfloat16")  # no bf16 peak in these ceilings: the fp32 roof, as the analysis
    assert fig.data[1].name.startswith("fp32 peak: 1 TFLOP/s") and fig.data[1].y[0] == pytest.approx(1.0)
    assert list(fig.data[2].x) == [20.0] and list(fig.data[2].y) == pytest.approx([0.2])  # TFLOP/s


@pytest.mark.parametrize("wait, warmup, active", [(1, 1, 3), (0, 1, 2), (2, 0, 1), (0, 0, 1)])
def test_progress_holds_still_while_profiled_steps_run(tmp_path, wait, warmup, active):
    """The page's progress callback passes nothing between profiled steps (a browser redrawing the
    bar competed with them: a compiled MLP's step 17-38 ms against 2.1-3.8 ms). Driven by a
    real capture: each update is tagged with the number of steps run when it arrived."""
    from profiler.capture.backends import CapturePlan
    from profiler.capture.runner import capture

    plan = CapturePlan(mode="infer", wait=wait, warmup=warmup, active=active, flops=False)
    shown, all_calls = [], []

    def bar(done: int, total: int, message: str) -> None:
        shown.append((done, message))

    def record(done: int, total: int, message: str) -> None:
        all_calls.append(done)
        quiet(done, total, message)

    quiet = pv.quiet_while_timed(bar, plan)
    capture("mlp", plan, tmp_path, size="tiny", progress=record)
    steps = plan.steps
    assert max(all_calls) == steps and set(range(1, steps + 1)) <= set(all_calls)  # one report per step
    inside = [d for d, _ in shown if 0 < d < steps]
    # between steps: reports whose next step is a wait step, and one note before the first warm-up
    # step (discarded); none before an active step
    assert inside == list(range(1, wait)) + ([wait] if wait and warmup else []), shown
    notes = [m for _, m in shown if m.startswith("timing ")]
    assert len(notes) == (1 if wait and warmup else 0)
    assert shown[-1][0] == steps  # the end is shown
    assert any(m.startswith(f"running {steps} steps") for _, m in shown)

