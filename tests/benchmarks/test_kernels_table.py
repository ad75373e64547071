"""benchmarks/kernels_table.py: the README's kernel table from kernels.csv rows of one run."""
from __future__ import annotations

import csv
from pathlib import Path

from benchmarks.kernels_table import load, main, select, summarize, to_markdown

HEADER = ["date", "machine", "benchmark", "variant", "shape", "metric", "p20", "p50", "p80", "unit", "notes"]


def _rows(date: str, threads: int, copy_bw: float, ours_ms: tuple, naive_ratio: tuple, aten_ratio=None):
    m = f"Intel(R) Xeon(R) Processor; 2 cpus; torch_threads={threads}; load1=1.00; malloc=glibc-default"
    out = [[date, m, "copy", "y.copy_(x)", "16777216 float32", "bandwidth", copy_bw, copy_bw, copy_bw, "GB/s", ""],
           [date, m, "copy", "z = x + 3y", "16777216 float32", "bandwidth", 2 * copy_bw, 2 * copy_bw, 2 * copy_bw,
            "GB/s", ""]]
    shape = "4096x768 float32 fwd"
    for metric, ratio in (("wall_time", "speedup_wall"), ("cpu_time", "speedup_cpu")):
        scale = 1.0 if metric == "cpu_time" else 1.5  # wall differs from CPU time, so the pick shows
        out.append([date, m, "layer_norm", "ours", shape, metric, *(scale * v for v in ours_ms), "ms", ""])
        out.append([date, m, "layer_norm", "ours_vs_naive", shape, ratio, *(scale * v for v in naive_ratio), "x", ""])
        if aten_ratio:
            out.append([date, m, "layer_norm", "ours_vs_aten", shape, ratio, *(scale * v for v in aten_ratio), "x", ""])
    out.append([date, m, "layer_norm", "ours", shape, "bandwidth", 5.0, 5.0, 5.0, "GB/s", ""])
    return out


def _write(path: Path, rows) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        w.writerows(rows)
    return path


def test_one_run_one_thread_count_cpu_time_at_one_thread_wall_above(tmp_path: Path) -> None:
    path = _write(tmp_path / "k.csv",
                  _rows("2026-12-01T10:00:00Z", 1, 10.0, (1.0, 2.0, 3.0), (4.0, 5.0, 6.0))  # an older run
                  + _rows("2026-12-03T17:20:00Z", 1, 20.0, (0.8, 0.9, 1.1), (7.0, 8.0, 9.0), (1.1, 1.2, 1.3))
                  + _rows("2026-12-03T17:40:00Z", 2, 30.0, (0.5, 0.6, 0.7), (3.0, 3.5, 4.0)))
    run = select(load(path), "2026-12-03T17:19")
    one = summarize(run, threads=1)
    assert one.to_dict("records") == [{
        "kernel": "layer_norm", "shape": "4096x768 float32 fwd", "ours ms p50 (p20-p80)": "0.9 (0.8-1.1)",
        "vs naive": "8", "vs foreach": "-", "vs ATen": "1.2", "vs torch.compile": "-", "ours GB/s": "5"}]
    assert one.attrs["ceilings"] == {"y.copy_(x)": 20.0, "z = x + 3y": 40.0}
    two = summarize(run, threads=2).iloc[0]
    assert two["ours ms p50 (p20-p80)"] == "0.9 (0.75-1.05)"  # wall time: 1.5x the CPU-time rows
    assert two["vs naive"] == "5.25" and two["vs ATen"] == "-"
    assert summarize(run, threads=2).attrs["ceilings"] == {"y.copy_(x)": 30.0, "z = x + 3y": 60.0}
    md = to_markdown(one).splitlines()
    assert md[0].startswith("| kernel | shape |") and md[1] == "|" + "---|" * 8 and len(md) == 3


def test_the_window_excludes_later_runs_and_an_empty_window_is_one_line(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path / "k.csv", _rows("2026-12-03T17:20:00Z", 1, 20.0, (1, 2, 3), (4, 5, 6)))
    assert summarize(select(load(path), "2026-12-03T17:00", "2026-12-03T17:10"), threads=1).empty
    assert main(["--since", "2026-12-04", "--csv", str(path)]) == 1
    assert capsys.readouterr().err.strip() == "kernels_table: no rows at 1 thread(s) in that window"
    assert main(["--since", "2026-12-03", "--csv", str(tmp_path / "missing.csv")]) == 2
    assert "cannot read" in capsys.readouterr().err
