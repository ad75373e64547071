"""`python -m profiler summary` as a user runs it: exit codes, one-line errors, JSON keys and values."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.profiler.trace.conftest import HALF_NS_US, raw_truth, trace_named

ROOT = Path(__file__).resolve().parents[3]


def _run(*args):
    return subprocess.run([sys.executable, "-m", "profiler", "summary", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_summary_json_matches_raw(tmp_path):
    path = trace_named("hta_v100_ns_resolution")
    out = tmp_path / "s.json"
    proc = _run(path, "--json", out)
    assert proc.returncode == 0, proc.stderr
    assert "kernels:" in proc.stdout
    s = json.loads(out.read_text())
    truth = raw_truth(path)
    assert {"events", "kernel_count", "kernel_total_us", "streams", "ranks", "span_us", "skipped_events"} <= set(s)
    assert s["kernel_count"] == truth["kernel_count"]
    assert s["kernel_total_us"] == pytest.approx(truth["kernel_total_us"], rel=1e-12)
    assert s["streams"] == len(truth["streams"]) and s["ranks"] == [truth["rank"]]
    assert abs(s["span_us"] - truth["last_end_rel"]) <= HALF_NS_US and s["events"] == len(truth["kept"])
    assert s["skipped_events"] == 0


def test_summary_of_two_ranks(tmp_path):
    a, b = trace_named("hta_a100_rank0of2_nccl"), trace_named("hta_v100_rank1of2")
    out = tmp_path / "two.json"
    proc = _run(a, b, "--json", out)
    assert proc.returncode == 0, proc.stderr
    s = json.loads(out.read_text())
    assert s["ranks"] == [0, 1]
    assert s["kernel_count"] == raw_truth(a)["kernel_count"] + raw_truth(b)["kernel_count"]
    assert s["streams"] == len(raw_truth(a)["streams"] | raw_truth(b)["streams"])


@pytest.mark.parametrize("content", [b"", b"{not json", b'{"x": 1}'])
def test_bad_input_exits_2_with_one_line(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    proc = _run(path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad.json" in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", ["summary", "analyze"])
@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "abc"])
def test_a_bad_decompression_limit_exits_2_with_one_line(command, value):
    """-1, nan and inf reached the loader and failed there with OverflowError / ValueError tracebacks."""
    proc = subprocess.run([sys.executable, "-m", "profiler", command, str(trace_named("hta_v100_ns_resolution")),
                           f"--max-decompressed-gb={value}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"python -m profiler {command}: error: argument --max-decompressed-gb: expected a number of GiB > 0, got "
        + (repr(value) if value == "abc" else value)]


def test_load_trace_refuses_a_limit_that_is_not_a_byte_count():
    from profiler.trace import TraceError, load_trace

    for bad in (-1, 0, float("nan"), float("inf"), "5", True, None):
        with pytest.raises(TraceError, match="max_decompressed_bytes must be a number of bytes >= 1"):
            load_trace(b'{"traceEvents": []}', max_decompressed_bytes=bad)


def test_missing_file_exits_2(tmp_path):
    proc = _run(tmp_path / "missing.json.gz")
    assert proc.returncode == 2 and "no such file" in proc.stderr


def test_summary_of_a_capture_folder(tmp_path):
    """`capture --out DIR` then `summary DIR`: the capture's saved Trace, as `analyze` opens it
    (the folder also holds summary.json and the roofline CSVs, which are not traces: before, the
    directory's JSON files were all read as traces and the first non-trace stopped it)."""
    cap = tmp_path / "cap"
    p = subprocess.run([sys.executable, "-m", "profiler", "capture", "mlp", "--size", "tiny", "--mode", "infer",
                        "--steps", "2", "--wait", "0", "--warmup", "1", "--ceilings", "none", "--quiet",
                        "--out", str(cap)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    runs = [_run(target, "--json", tmp_path / f"{target.name}.json") for target in (cap, cap / "trace")]
    for proc in runs:
        assert proc.returncode == 0, proc.stderr
        assert "steps: " in proc.stdout and "by kind: cpu_op=" in proc.stdout
    a, b = (json.loads((tmp_path / f"{t}.json").read_text()) for t in ("cap", "trace"))
    assert a == b and a["ranks"] == [0] and a["events"] > 0 and len(a["steps"]) == 2


def test_summary_says_what_it_did_not_read(tmp_path):
    """Events of kinds FusionLens does not model are named on the terminal and in the JSON; a
    Chrome trace of another tool exits 2 with one line."""
    import gzip

    doc = json.loads(gzip.decompress(trace_named("tracelens_h100_bert_small").read_bytes()))
    doc["traceEvents"] += [{"ph": "X", "cat": "xpu_runtime", "name": "launch", "pid": 1, "tid": 1, "ts": 1e3,
                            "dur": 1}] * 3
    path, out = tmp_path / "mixed.json", tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    proc = _run(path, "--json", out)
    assert proc.returncode == 0, proc.stderr
    assert 'not read: 3 events of kinds FusionLens does not model ("xpu_runtime" x3)' in proc.stdout
    assert json.loads(out.read_text())["unread_events"] == {'"xpu_runtime"': 3}
    foreign = tmp_path / "jax.json"
    foreign.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "fusion", "pid": 1, "tid": 1, "ts": 1,
                                                    "dur": 2}]}))
    proc = _run(foreign)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"error: {foreign}: not a PyTorch profiler (Kineto) trace: its one event is not of a kind FusionLens "
        "reads (seen: (no category) x1)"]
