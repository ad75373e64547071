"""The Kineto backend's profiler settings: what the default capture records and what it turns off.

External correlation is off on CPU (an overhead lever, bench_capture.py --perop); these tests check
that it is on exactly where kernels need it (CUDA), that turning it off loses no op, name or step
marker, and that the overhead benchmark measures the capture's own settings.
"""
import json

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from benchmarks.bench_capture import options
from profiler.capture.backends import CapturePlan
from profiler.capture.kineto import external_correlation, profiler_options, run_steps
from profiler.capture.runner import capture


def test_default_cpu_options_record_only_what_the_plan_asks():
    opts = profiler_options(CapturePlan())
    assert opts["activities"] == [ProfilerActivity.CPU]
    assert not any(opts[k] for k in ("record_shapes", "profile_memory", "with_stack", "with_modules",
                                     "with_flops", "acc_events"))
    assert external_correlation(CapturePlan()) is False


def test_heavier_modes_and_cuda_follow_the_plan():
    opts = profiler_options(CapturePlan(record_shapes=True, profile_memory=True, with_stack=True))
    assert opts["record_shapes"] and opts["profile_memory"] and opts["with_stack"]
    cuda = profiler_options(CapturePlan(device="cuda"))
    assert cuda["activities"] == [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    # kernels are linked to their launching op through External id: correlation stays on
    assert external_correlation(CapturePlan(device="cuda:0")) is True


def _comparable(opts):
    """The options with the (pybind, no __eq__) experimental config as its pickled state."""
    cfg = opts["experimental_config"]
    return {**opts, "experimental_config": None if cfg is None else cfg.__getstate__()}


def test_benchmark_measures_the_capture_settings():
    plan = CapturePlan(mode="infer")
    assert options("eager", plan) is None
    assert _comparable(options("kineto", plan)) == _comparable(profiler_options(plan))
    assert options("+shapes", plan)["record_shapes"] is True
    assert options("kineto-extcorr", plan)["experimental_config"] is None


def _events(opts, tmp_path, tag):
    """cpu_op and ProfilerStep events of 3 recorded steps of a fixed op sequence, from the raw JSON."""
    x, w = torch.ones(4, 8), torch.ones(8, 3, requires_grad=True)
    path = tmp_path / f"{tag}.json"
    sched = schedule(wait=0, warmup=1, active=3, repeat=1)
    with profile(schedule=sched, on_trace_ready=lambda p: p.export_chrome_trace(str(path)), **opts) as prof:
        for _ in range(4):
            (torch.relu(x @ w) * 2.0).sum().backward()
            prof.step()
    evs = json.loads(path.read_text())["traceEvents"]
    ops = [e for e in evs if e.get("cat") == "cpu_op"]
    steps = [e["name"] for e in evs if str(e.get("name", "")).startswith("ProfilerStep#")]
    return ops, steps


def test_external_correlation_off_loses_no_op(tmp_path):
    plan = CapturePlan()
    off_ops, off_steps = _events(profiler_options(plan), tmp_path, "off")
    on_ops, on_steps = _events(options("kineto-extcorr", plan), tmp_path, "on")
    assert [e["name"] for e in off_ops] == [e["name"] for e in on_ops]
    assert off_steps == on_steps == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]
    assert {"aten::mm", "aten::relu", "aten::mul", "aten::sum"} <= {e["name"] for e in off_ops}
    # ops keep their own External id (their correlation id): only the push onto Kineto's
    # device-correlation stack, which tags GPU activity, is skipped
    def with_ids(ops):
        return [e["name"] for e in ops if "External id" in e.get("args", {})]

    assert with_ids(off_ops) == with_ids(on_ops) == [e["name"] for e in on_ops]


def test_default_capture_keeps_markers_names_and_the_cost_join(tmp_path):
    res = capture("mlp", CapturePlan(mode="train", wait=0, warmup=1, active=2), tmp_path, size="tiny")
    ev = res.trace.events
    names = ev["name"].astype(str)
    assert names.str.startswith("ProfilerStep#").sum() == 2
    assert {"aten::addmm", "Optimizer.step#AdamW.step"} <= set(names)
    assert res.trace.meta["capture"]["join"]["match_rate"] >= 0.9
    assert ev.loc[ev["kind"] == "cpu_op", "flops"].sum() > 0


def _capture_events(tmp_path, tag, run):
    """(cat, name) of every CPU event of 2 active steps of a fixed op sequence, from the raw JSON."""
    x, w = torch.ones(4, 8), torch.ones(8, 3, requires_grad=True)

    def step(i):
        (torch.relu(x @ w) * 2.0).sum().backward()

    path = tmp_path / f"{tag}.json"
    run(step, path)
    evs = json.loads(path.read_text())["traceEvents"]
    return [(e.get("cat"), e["name"]) for e in evs if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")]


def test_run_steps_records_what_torch_schedule_records(tmp_path):
    plan = CapturePlan(wait=1, warmup=1, active=2)

    def ours(step, path):
        prof = profile(**profiler_options(plan))
        run_steps(prof, step, plan)
        prof.export_chrome_trace(str(path))

    def torchs(step, path):  # the reference: torch's schedule and prof.step() markers
        sched = schedule(wait=1, warmup=1, active=2, repeat=1)
        with profile(schedule=sched, on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
                     **profiler_options(plan)) as prof:
            for i in range(plan.steps):
                step(i)
                prof.step()

    mine, ref = _capture_events(tmp_path, "ours", ours), _capture_events(tmp_path, "torch", torchs)
    assert mine == ref
    assert [n for c, n in mine if c == "user_annotation"] == ["ProfilerStep#2", "ProfilerStep#3"]
    assert sum(c == "cpu_op" for c, _ in mine) >= 2 * 5


def test_run_steps_stops_the_profiler_when_a_step_raises(tmp_path):
    plan = CapturePlan(wait=0, warmup=0, active=3)
    prof = profile(**profiler_options(plan))

    def step(i):
        torch.ones(2).add(1)
        if i == 1:
            raise RuntimeError("boom")

    try:
        run_steps(prof, step, plan)
    except RuntimeError:
        pass
    assert not torch.autograd._profiler_enabled()
    prof.export_chrome_trace(str(tmp_path / "t.json"))  # what ran before the failure is kept
    names = [e["name"] for e in json.loads((tmp_path / "t.json").read_text())["traceEvents"]]
    assert "ProfilerStep#0" in names and "ProfilerStep#1" in names
