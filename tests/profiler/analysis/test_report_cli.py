"""`python -m profiler analyze`: exit codes, the documented JSON keys, strict JSON, --compare."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from profiler.analysis.report_json import REPORT_SCHEMA_VERSION, build_report, jsonable
from tests.profiler.analysis.synth import TRACES_DIR, real_trace
from tests.profiler.analysis.raw_json import raw_events

ROOT = Path(__file__).resolve().parents[3]
BERT = str(TRACES_DIR / "tracelens_h100_bert_small.json.gz")
VIT = str(TRACES_DIR / "tracelens_h100_falconsai_nsfw.json.gz")
NCCL = str(TRACES_DIR / "hta_a100_rank0of2_nccl_data.json.gz")
REQUIRED = ("schema_version", "kernel_type_breakdown", "kernel_breakdown", "temporal", "comm_comp_overlap_pct",
            "idle", "findings", "analyses", "errors")


def analyze(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "profiler", "analyze", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def strict_load(path: Path) -> dict:
    def no_constants(c):
        raise AssertionError(f"non-strict JSON constant {c}")

    return json.loads(path.read_text(), parse_constant=no_constants)


def test_cli_json_has_documented_keys_and_matches_raw(tmp_path):
    out = tmp_path / "r.json"
    p = analyze(NCCL, "--json", str(out))
    assert p.returncode == 0, p.stderr
    assert "top kernels" in p.stdout and "findings" in p.stdout
    r = strict_load(out)
    for k in REQUIRED:
        assert k in r, k
    assert r["schema_version"] == REPORT_SCHEMA_VERSION and r["errors"] == {}
    assert set(r["kernel_type_breakdown"]) == {"computation", "communication", "memory"}
    assert set(r["temporal"]["0"]) == {"idle_us", "compute_us", "non_compute_us", "span_us"}
    assert 0 <= r["comm_comp_overlap_pct"]["0"] <= 100
    assert all({"idle_us", "host_wait_us", "kernel_wait_us", "other_us"} <= set(v) for v in r["idle"]["0"].values())
    for f in r["findings"]:
        assert {"rule", "severity", "message", "est_saving_us"} <= set(f)
    # kernel totals per name against the raw JSON
    truth: dict[str, float] = {}
    for e in raw_events("hta_a100_rank0of2_nccl_data.json.gz"):
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            truth[e["name"]] = truth.get(e["name"], 0.0) + float(e["dur"])
    ours = {k["name"]: k["total_us"] for k in r["kernel_breakdown"]}
    assert set(ours) == set(truth)
    assert all(ours[n] == pytest.approx(truth[n], rel=1e-6, abs=1e-3) for n in truth)
    comm = r["kernel_type_breakdown"]["communication"]
    assert comm == pytest.approx(sum(v for n, v in truth.items() if n.startswith("ncclKernel")), rel=1e-6)
    assert r["trace"]["unread_events"] == {} and "not read" not in p.stdout


def test_cli_names_the_events_it_did_not_read(tmp_path):
    """Events of kinds no column models (another backend's runtime) stay out of every analysis;
    the terminal and the JSON's `trace` object say how many and which."""
    doc = {"traceEvents": list(raw_events("tracelens_h100_bert_small.json.gz")) + [
        {"ph": "X", "cat": "privateuse1_runtime", "name": "launch", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0}] * 2}
    src, out = tmp_path / "mixed.json", tmp_path / "r.json"
    src.write_text(json.dumps(doc))
    p = analyze(str(src), "--json", str(out))
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[1] == ('not read: 2 events of kinds FusionLens does not model '
                                        '("privateuse1_runtime" x2)')
    assert strict_load(out)["trace"]["unread_events"] == {'"privateuse1_runtime"': 2}


def test_cli_compare_includes_diff(tmp_path):
    out = tmp_path / "c.json"
    p = analyze(BERT, "--json", str(out), "--compare", VIT)
    assert p.returncode == 0, p.stderr
    assert "diff vs" in p.stdout
    r = strict_load(out)
    d = r["diff"]
    assert {"kernels", "ops", "totals", "new_kernels", "vanished_kernels"} <= set(d)
    deltas = [abs(k["delta_us"]) for k in d["kernels"]]
    assert deltas == sorted(deltas, reverse=True)
    assert all(k["delta_pct"] is None for k in d["kernels"] if k["status"] == "new")


@pytest.mark.parametrize("content", ['{"traceEvents": [', "not json at all", ""])
def test_cli_bad_input_exits_2_with_one_line(tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    p = analyze(str(bad))
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_cli_missing_file_and_bad_compare(tmp_path):
    p = analyze(str(tmp_path / "missing.json"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    p = analyze(BERT, "--compare", str(bad))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_report_two_ranks_runs_stragglers():
    from profiler.trace import load_trace

    tr = load_trace([str(TRACES_DIR / "hta_a100_rank0of2_nccl_data.json.gz"),
                     str(TRACES_DIR / "hta_v100_rank1of2_trace_diff_test.json.gz")])
    r = build_report(tr)
    json.dumps(r, allow_nan=False)
    assert r["errors"] == {} and "stragglers" in r["analyses"]
    assert set(r["temporal"]) == set(r["comm_comp_overlap_pct"]) == {"0", "1"}


def test_report_multi_rank_and_generic_serialisation():
    tr = real_trace("tracelens_mi300x_torch_compile_triton.json.gz")
    r = build_report(tr)
    json.dumps(r, allow_nan=False)
    assert r["errors"] == {}
    assert "attribution" in r["analyses"] and "stragglers" in r["analyses_skipped"]
    assert jsonable(float("nan")) is None and jsonable({"a": [1.5, float("inf")]}) == {"a": [1.5, None]}


def test_bench_analyses_script_runs_small(tmp_path):
    """Smoke test of the benchmark script on a small trace (timings are not checked)."""
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_analyses.py"), "--trace", BERT,
                        "--rounds", "1", "--no-csv"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "all analyses / ingestion" in p.stdout and "attribution" in p.stdout


def test_cli_on_a_cpu_only_capture_folder_and_its_kineto_json(tmp_path):
    """`capture --out DIR` then `analyze DIR`: the saved Parquet Trace loads (with its joined
    FLOPs), a CPU-only run prints its top CPU ops and writes strict JSON; the Kineto JSON works too."""
    cap = tmp_path / "cap"
    p = subprocess.run([sys.executable, "-m", "profiler", "capture", "mlp", "--size", "tiny", "--mode", "infer",
                        "--steps", "2", "--wait", "0", "--warmup", "1", "--ceilings", "none", "--quiet",
                        "--out", str(cap)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    for target in (cap, cap / "trace", cap / "trace" / "events.parquet", cap / "kineto_rank0.pt.trace.json"):
        out = tmp_path / f"{target.name}.report.json"
        p = analyze(str(target), "--json", str(out))
        assert p.returncode == 0, p.stderr
        assert "no GPU activity" in p.stdout and "top CPU ops by self time" in p.stdout and "aten::addmm" in p.stdout
        assert "roofline against" not in p.stdout  # no roofs (--ceilings none; a CPU upload has none)
        r = strict_load(out)
        assert r["errors"] == {} and r["kernel_breakdown"] == [] and isinstance(r["findings"], list)
        assert r["comm_comp_overlap_pct"] == {"0": None}
    p = analyze(str(cap), NCCL)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "alone" in p.stderr


def test_whole_report_python_calls_do_not_grow_with_events():
    """Every analysis and rule together (attribution, distributed and the rules included, not only
    the time analyses): 8x the events, the same number of Python calls, so no per-event loop."""
    from tests.profiler.analysis.synth import columnar_trace
    from tests.profiler.analysis.test_time_analyses import python_calls

    small, large = columnar_trace(2_000), columnar_trace(16_000)
    r = build_report(small)
    assert r["errors"] == {} and "attribution" in r["analyses"] and r["findings"] is not None
    n_small, n_large = python_calls(build_report, small), python_calls(build_report, large)
    # an absolute margin: one Python call per extra event would add 14,000 (a 10% margin would not see it)
    assert n_large < n_small + 5_000, (n_small, n_large)


def test_cli_unusable_options_are_one_line_errors(tmp_path):
    """--json naming a folder (it once wrote its temporary file beside the folder, e.g. at /),
    an unwritable --json path, negative --top/--max-rows: exit 2, one line, nothing left behind."""
    p = analyze(BERT, "--json", str(tmp_path))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "is a directory" in p.stderr
    assert p.stdout == "" and list(tmp_path.parent.glob(f".{tmp_path.name}.*.tmp")) == []
    blocker = tmp_path / "file"
    blocker.write_text("")
    p = analyze(BERT, "--json", str(blocker / "r.json"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "cannot write" in p.stderr
    for opt in ("--top", "--max-rows"):
        p = analyze(BERT, opt, "-1")
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and ">= 0" in p.stderr


def test_cli_summary_of_a_cpu_ddp_pair(tmp_path):
    """Two gloo ranks (tests/data/ddp_cpu): the step line names the communication, each rank's CPU
    collectives get their overlap, and no empty GPU lines are printed; the JSON agrees."""
    ddp = ROOT / "tests" / "data" / "ddp_cpu"
    out = tmp_path / "ddp.json"
    p = analyze(*(str(f) for f in sorted(ddp.glob("*.json.gz"))), "--json", str(out))
    assert p.returncode == 0, p.stderr
    assert "GPU span" not in p.stdout and "kernel types" not in p.stdout
    assert "rank 0 (CPU collectives): comm/compute overlap" in p.stdout
    assert "rank 1 (CPU collectives): comm/compute overlap" in p.stdout
    r = strict_load(out)
    steps = r["step_breakdown"]
    comm = sum(s["communication_us"] for s in steps) / sum(s["duration_us"] for s in steps)
    step_line = next(line for line in p.stdout.splitlines() if line.startswith("step time"))
    assert f"communication {100 * comm:.0f}%" in step_line and comm > 0.4
