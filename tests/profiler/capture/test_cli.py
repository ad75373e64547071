"""`python -m profiler capture`: files written and exit status 0; bad input is one line and 2."""
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def run(*args, data_dir=None, extra_env=None):
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **(extra_env or {})}
    if data_dir is not None:  # measured ceilings are cached here, not in the repository
        env["FUSIONLENS_DATA_DIR"] = str(data_dir)
    return subprocess.run([sys.executable, "-m", "profiler", "capture", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=240, env=env)


def test_capture_writes_everything(tmp_path):
    out = tmp_path / "cap"
    proc = run("mlp", "--size", "tiny", "--mode", "infer", "--steps", "2", "--out", str(out), "--ceilings", "quick",
               data_dir=tmp_path / "data")
    assert proc.returncode == 0, proc.stderr
    assert "[4/4]" in proc.stderr and "source off: nvml" in proc.stdout
    assert "USDT" not in proc.stderr  # Kineto's start/stop log lines stay out of the progress
    assert (out / "kineto_rank0.pt.trace.json").is_file()
    assert (out / "trace" / "events.parquet").is_file() and (out / "trace" / "meta.json").is_file()
    assert (out / "roofline.csv").read_text().startswith("kind,name")
    with open(out / "roofline.csv", newline="") as fh:
        roof = list(csv.DictReader(fh))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["profiled_steps"] == 2 and summary["flops_total"] > 0
    assert "lower bound" in summary["bytes_note"]
    # the summary names the roofs the table used: the measured fp32 peak is the table's peak
    used = summary["roofline_ceilings"]
    assert used["source"] == "measured" and used["mem_bw_bytes_per_s"] > 0
    assert roof and {float(r["peak_flops_per_s"]) for r in roof} == {used["peak_flops_per_s"]["fp32"]}
    # per module: the MLP's Linear layers (Sequential.0, .2) with their addmm FLOPs, as roofline.csv's
    with open(out / "roofline_modules.csv", newline="") as fh:
        mods = {r["module"]: float(r["flops"]) for r in csv.DictReader(fh)}
    addmm = sum(float(r["flops"]) for r in roof if r["name"] == "aten::addmm")
    assert mods["Sequential.0"] + mods["Sequential.2"] == addmm > 0
    top_modules = {r["module"]: r["flops"] for r in summary["top_modules_by_time"]}
    assert top_modules["Sequential.0"] == mods["Sequential.0"] and top_modules["Sequential.2"] == mods["Sequential.2"]
    # the saved Trace keeps the roofs it was measured against: `analyze DIR` makes the same roofline
    meta = json.loads((out / "trace" / "meta.json").read_text())
    assert meta["capture"]["roofline_ceilings"] == used
    report = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "profiler", "analyze", str(out), "--json", str(report)], cwd=ROOT,
                          capture_output=True, text=True, timeout=240, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert "top op types by headroom" in proc.stdout and "aten::addmm" in proc.stdout
    assert "top modules (own ops, forward + backward) by headroom" in proc.stdout and "Sequential.2" in proc.stdout
    analysed = json.loads(report.read_text())["analyses"]["roofline"]
    assert analysed["reason"] is None and analysed["ceilings"] == used
    got = {r["module"]: r["flops"] for r in analysed["by_module"]["records"]}
    assert got == pytest.approx(mods)


def test_kineto_log_level_set_by_the_user_is_kept(tmp_path):
    """torch 2.13's Kineto logs its start/stop at the default level; a user's KINETO_LOG_LEVEL wins."""
    proc = run("mlp", "--size", "tiny", "--steps", "1", "--out", str(tmp_path), "--ceilings", "none", "--quiet",
               extra_env={"KINETO_LOG_LEVEL": "1"})
    assert proc.returncode == 0, proc.stderr
    assert "profiler_start" in proc.stderr


def test_roofline_missing_is_explained(tmp_path):
    proc = run("mlp", "--size", "tiny", "--steps", "1", "--out", str(tmp_path), "--ceilings", "none", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "turned off" in (tmp_path / "roofline_missing.txt").read_text()
    # the datasheet table has no CPU entry: the note says how to get this machine's roofs instead
    proc = run("mlp", "--size", "tiny", "--steps", "1", "--out", str(tmp_path), "--ceilings", "table", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "--ceilings measured" in (tmp_path / "roofline_missing.txt").read_text()


def test_bad_spec_exits_2_with_one_line(tmp_path):
    proc = run(str(tmp_path / "missing.py") + ":build", "--out", str(tmp_path))
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("[")]
    assert len(lines) == 1 and "file not found" in lines[0]


def test_bad_arguments_exit_2(tmp_path):
    assert run("mlp", "--set", "nonsense", "--out", str(tmp_path)).returncode == 2
    assert run("mlp", "--steps", "0", "--out", str(tmp_path)).returncode == 2
    assert run("mlp", "--mode", "fly").returncode == 2


def test_bad_input_through_the_cli_is_one_line_naming_spec_and_cause(tmp_path):
    """What a user types, end to end: each failure is exit 2 and one stderr line (no traceback)
    that names the spec and the cause; progress lines (`[i/n] ...`) are not errors."""
    specs = {
        "noimport.py": "import fusionlens_no_such_module\ndef build(): pass\n",
        "wrong.py": "def build(): return 42\n",
        "raises.py": "def build(): raise ValueError('boom in build')\n",
        "stepfails.py": ("import torch\nclass M(torch.nn.Module):\n    def forward(self, x): raise RuntimeError('bad forward')\n"
                         "def build(): return M(), (torch.randn(2, 2),)\n"),
    }
    for name, body in specs.items():
        (tmp_path / name).write_text(body)
    cases = [
        (["mlp", "--size", "tiny", "--device", "cuda"], "'mlp'", "no CUDA device"),
        ([f"{tmp_path / 'noimport.py'}:build"], "noimport.py:build", "ModuleNotFoundError"),
        ([f"{tmp_path / 'wrong.py'}:build"], "wrong.py:build", "must return (model, inputs), got int"),
        ([f"{tmp_path / 'raises.py'}:build"], "raises.py:build", "ValueError: boom in build"),
        ([f"{tmp_path / 'stepfails.py'}:build", "--mode", "infer"], "stepfails.py:build",
         "first (unprofiled) step raised RuntimeError: bad forward"),
    ]
    for args, names, cause in cases:
        proc = run(*args, "--out", str(tmp_path / "out"), "--ceilings", "none")
        lines = [line for line in proc.stderr.splitlines() if not line.startswith("[")]
        assert proc.returncode == 2, (args, proc.stderr)
        assert len(lines) == 1 and "Traceback" not in proc.stderr, (args, proc.stderr)
        assert names in lines[0] and cause in lines[0], (args, lines[0])


def test_unusable_out_folder_is_one_line(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    for out, cause in ((afile, "is a file"), (afile / "sub", "cannot create it")):
        proc = run("mlp", "--size", "tiny", "--out", str(out))
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: --out {out}: {cause}")


def test_two_cpu_captures_compare_by_step_time_and_op_cpu_time(tmp_path):
    """capture A and B (a wider MLP), then `analyze A --compare B`: the median step of each equals
    the median ProfilerStep span in its Kineto JSON (read here independently), and with no GPU
    kernel on either side the diff lists ops by their change of CPU time."""
    steps = {}
    for name, hidden in (("a", 16), ("b", 256)):
        proc = run("mlp", "--size", "tiny", "--set", f"hidden={hidden}", "--mode", "train", "--steps", "3",
                   "--out", str(tmp_path / name), "--ceilings", "none")
        assert proc.returncode == 0, proc.stderr
        events = json.loads((tmp_path / name / "kineto_rank0.pt.trace.json").read_text())["traceEvents"]
        spans = sorted(float(e["dur"]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
        assert len(spans) == 3
        steps[name] = spans[1]
    report = tmp_path / "diff.json"
    proc = subprocess.run([sys.executable, "-m", "profiler", "analyze", str(tmp_path / "a"), "--compare",
                           str(tmp_path / "b"), "--json", str(report)], cwd=ROOT, capture_output=True, text=True,
                          timeout=240, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    totals = json.loads(report.read_text())["diff"]["totals"]
    assert totals["step_us_a"] == pytest.approx(steps["a"], abs=1.0)
    assert totals["step_us_b"] == pytest.approx(steps["b"], abs=1.0)
    assert totals["delta_step_pct"] == pytest.approx(100 * (steps["b"] - steps["a"]) / steps["a"], rel=1e-3)
    assert f"median step {steps['a']:,.0f} -> {steps['b']:,.0f} µs" in proc.stdout
    assert "no GPU kernels in either trace: ops by change of CPU time" in proc.stdout
    lines = proc.stdout.split("(inclusive, all calls):")[1].strip().splitlines()
    assert len(lines) >= 3 and all(" µs" in line for line in lines[:3])


def test_a_capture_into_a_used_folder_leaves_only_its_own_files(tmp_path):
    """An earlier capture's roofline, op costs and a stale second rank's JSON would be read as this
    run's (beside its roofline_missing.txt, joined by a DDP load, listed in its summary): they go
    once the new capture has run; a failed capture removes nothing; files a capture never writes
    stay."""
    out = tmp_path / "cap"
    assert run("mlp", "--size", "tiny", "--steps", "1", "--out", str(out), "--ceilings", "quick",
               data_dir=tmp_path / "data").returncode == 0
    assert {"roofline.csv", "roofline_modules.csv", "op_costs_rank0.parquet"} <= {p.name for p in out.iterdir()}
    (out / "kineto_rank1.pt.trace.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    before = {p.name: p.stat().st_mtime for p in out.iterdir()}
    failed = run("no_such_zoo_model", "--out", str(out), "--ceilings", "none")
    assert failed.returncode == 2  # a failed capture loses nothing of the earlier one
    assert {p.name: p.stat().st_mtime for p in out.iterdir()} == before
    proc = run("mlp", "--size", "tiny", "--steps", "1", "--out", str(out), "--ceilings", "none", "--no-flops")
    assert proc.returncode == 0, proc.stderr
    names = {p.name for p in out.iterdir()}
    assert names == {"kineto_rank0.pt.trace.json", "roofline_missing.txt", "summary.json", "trace", "notes.txt"}
    summary = json.loads((out / "summary.json").read_text())
    assert [Path(p).name for p in summary["files"]["kineto_json"]] == ["kineto_rank0.pt.trace.json"]
    assert summary["flops_total"] == 0


def test_dtype_takes_the_short_names_users_type():
    from profiler.cli.capture import dtype_name

    assert [dtype_name(v) for v in ("bf16", "FP16", "half", "fp32", "float", "double", "torch.bfloat16", "float64")] \
        == ["bfloat16", "float16", "float16", "float32", "float32", "float64", "bfloat16", "float64"]
    proc = run("mlp", "--dtype", "int8")
    assert proc.returncode == 2 and "invalid choice: 'int8'" in proc.stderr


def test_without_out_a_capture_lands_in_the_data_dir_where_the_load_page_lists_it(tmp_path):
    """The default --out used to be ./.fusionlens/captures whatever FUSIONLENS_DATA_DIR said, so a
    capture made with another data dir never showed under the Load page's earlier captures."""
    from profiler.capture.artifacts import recent_captures

    data = tmp_path / "data"
    proc = run("mlp", "--size", "tiny", "--mode", "infer", "--steps", "1", "--ceilings", "none", data_dir=data)
    assert proc.returncode == 0, proc.stderr
    found = recent_captures(data / "captures")
    assert len(found) == 1 and found[0].name.startswith("mlp-")
    assert f"wrote {found[0]}/" in proc.stdout


def test_a_failed_capture_leaves_no_empty_folder_in_the_data_dir(tmp_path):
    """Every failed attempt (a typo in the spec, a model out of memory) left an empty
    `<spec>-<time>` folder under the data dir's captures; a folder the user named stays."""
    data = tmp_path / "data"
    for spec in ("mlp-typo", f"{tmp_path / 'missing.py'}:build"):
        proc = run(spec, "--steps", "1", data_dir=data)
        assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: spec "), proc.stderr
    assert list((data / "captures").iterdir()) == []
    named = tmp_path / "mine"
    assert run("mlp-typo", "--out", str(named), data_dir=data).returncode == 2
    assert named.is_dir()


def test_default_out_dirs_of_one_second_differ(tmp_path, monkeypatch):
    from profiler.capture.report import default_out_dir

    monkeypatch.setenv("FUSIONLENS_DATA_DIR", str(tmp_path))
    first = default_out_dir("a/b.py:build")
    assert first.parent == tmp_path / "captures" and first.name.startswith("a_b.py_build-")
    first.mkdir(parents=True)
    second = default_out_dir("a/b.py:build")
    assert not second.exists() and second != first
    assert second.name == first.name + "-2" or second.name > first.name  # same second, or a later one
