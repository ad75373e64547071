"""benchmarks/kernels/ab_build.py without a C++ build: source collection at a git revision, the op
namespace rename, the staged build directory, and the before/after rows and table.

Truths are independent of the helper: git's blob ids (recomputed here from the returned bytes
with SHA-1, as git defines them), header lists read off this repository's history, literal
expected C++ text, and synthetic timings whose percentiles and ratios are worked out by hand.
"""
from __future__ import annotations

import csv
import hashlib
import subprocess
from pathlib import Path

import pytest

from benchmarks.harness import Timing
from benchmarks.kernels import ab_build as ab

ROOT = Path(__file__).resolve().parents[2]
# e66a811: the first fused norms, when kernels/csrc had one header; d0b4538: the per-ISA dispatch.
E66 = "e66a811"
D0B = "d0b4538"
D0B_HEADERS = ["activations_impl.h", "common.h", "convert_impl.h", "cross_entropy_impl.h", "norms_impl.h",
               "norms_vec_impl.h", "optim_impl.h", "per_isa.h", "rope_impl.h", "softmax_impl.h", "vec_impl.h"]


def _have(rev: str) -> bool:
    done = subprocess.run(["git", "cat-file", "-e", f"{rev}^{{commit}}"], cwd=ROOT, capture_output=True)
    return done.returncode == 0


def _blob_id(data: bytes) -> str:
    """git's object id of a file's bytes: sha1 of 'blob <len>\\0' + bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _git_blob_id(rev: str, name: str) -> str:
    return subprocess.run(["git", "rev-parse", f"{rev}:kernels/csrc/{name}"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.fixture
def need_history():
    for rev in (E66, D0B):
        if not _have(rev):
            pytest.skip(f"git history without {rev} (shallow clone?)")


def test_sources_at_old_revision_takes_its_own_headers(need_history):
    files = ab.sources_at(E66, ["norms.cpp"])
    assert list(files) == ["norms.cpp", "common.h"]  # the only header kernels/csrc had then
    for name, data in files.items():
        assert _blob_id(data) == _git_blob_id(E66, name)
    assert files["common.h"] != (ROOT / "kernels/csrc/common.h").read_bytes()  # not the working tree's


def test_sources_at_keeps_order_and_lists_every_header_of_the_revision(need_history):
    files = ab.sources_at(D0B, ["softmax.cpp", "rope.cpp"])
    assert list(files) == ["softmax.cpp", "rope.cpp", *D0B_HEADERS]
    assert all(_blob_id(files[n]) == _git_blob_id(D0B, n) for n in files)


def test_sources_at_working_tree():
    csrc = ROOT / "kernels" / "csrc"
    files = ab.sources_at(None, ["rope.cpp"])
    assert files["rope.cpp"] == (csrc / "rope.cpp").read_bytes()
    assert list(files)[1:] == sorted(p.name for p in csrc.glob("*.h"))
    assert all(files[p.name] == p.read_bytes() for p in csrc.glob("*.h"))


def test_snapshot_id_is_sha256_of_names_and_bytes_in_order():
    files = {"a.cpp": b"x", "b.h": b"yz"}
    assert ab.snapshot_id(files) == hashlib.sha256(b"a.cppxb.hyz").hexdigest()[:12]
    assert ab.snapshot_id({"b.h": b"yz", "a.cpp": b"x"}) != ab.snapshot_id(files)


@pytest.mark.parametrize("rev,names,needle", [
    ("no-such-rev-xyz", ["norms.cpp"], "no git revision 'no-such-rev-xyz'"),
    ("HEAD", ["nope.cpp"], "kernels/csrc/nope.cpp at HEAD"),
    (None, ["nope.cpp"], "kernels/csrc/nope.cpp does not exist in the working tree"),
    (None, [], "no sources named"),
])
def test_sources_at_bad_input_is_one_line_error(rev, names, needle):
    with pytest.raises(ab.ABBuildError) as err:
        ab.sources_at(rev, names)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_rename_namespace_touches_only_registrations():
    src = (b"namespace fusionlens {\nfloat f() { return fusionlens::g(); }\n}\n"
           b"TORCH_LIBRARY_FRAGMENT(fusionlens, m) {}\n"
           b"TORCH_LIBRARY_IMPL( fusionlens , CPU, m) {}\n"
           b"TORCH_LIBRARY(fusionlens, m) {}\n"
           b"TORCH_LIBRARY_FRAGMENT(fusionlens_other, m) {}\n")
    assert ab.rename_namespace(src, "fusionlens_old") == (
        b"namespace fusionlens {\nfloat f() { return fusionlens::g(); }\n}\n"
        b"TORCH_LIBRARY_FRAGMENT(fusionlens_old, m) {}\n"
        b"TORCH_LIBRARY_IMPL(fusionlens_old, CPU, m) {}\n"
        b"TORCH_LIBRARY(fusionlens_old, m) {}\n"
        b"TORCH_LIBRARY_FRAGMENT(fusionlens_other, m) {}\n")
    with pytest.raises(ab.ABBuildError, match="not a C\\+\\+ identifier"):
        ab.rename_namespace(src, "bad-name")


def test_rename_namespace_on_a_real_source():
    text = (ROOT / "kernels/csrc/norms.cpp").read_bytes()
    renamed = ab.rename_namespace(text, "fusionlens_new")
    registrations = text.count(b"TORCH_LIBRARY")
    assert registrations >= 2
    assert renamed.count(b"(fusionlens_new,") == registrations
    assert renamed.replace(b"(fusionlens_new,", b"(fusionlens,") == text


def test_stage_writes_renamed_sources_and_verbatim_headers(tmp_path):
    files = {"k.cpp": b'#include "k.h"\nTORCH_LIBRARY_FRAGMENT(fusionlens, m) {}\n',
             "k.h": b"// TORCH_LIBRARY_FRAGMENT(fusionlens, m) in a header stays\n"}
    out, ns = ab.stage("old", files, ["-O2"], tmp_path)
    assert ns == "fusionlens_old" and out.parent == tmp_path and out.name.startswith("old_")
    assert (out / "k.cpp").read_bytes() == b'#include "k.h"\nTORCH_LIBRARY_FRAGMENT(fusionlens_old, m) {}\n'
    assert (out / "k.h").read_bytes() == files["k.h"]
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert ab.stage("old", files, ["-O2"], tmp_path)[0] == out  # same inputs: same dir, nothing rewritten
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    assert ab.stage("old", files, ["-O3"], tmp_path)[0] != out  # other flags, other build
    assert ab.stage("new", files, ["-O2"], tmp_path)[0] != out  # other side, other build
    changed = {**files, "k.h": b"// edited\n"}
    assert ab.stage("old", changed, ["-O2"], tmp_path)[0] != out  # other header bytes, other build


def test_stage_refuses_a_source_without_registrations(tmp_path):
    with pytest.raises(ab.ABBuildError, match="registers no ops"):
        ab.stage("old", {"k.cpp": b"int f();\n"}, [], tmp_path)
    with pytest.raises(ab.ABBuildError, match="no .cpp"):
        ab.stage("old", {"k.h": b""}, [], tmp_path)


def _timing() -> Timing:
    # Three rounds. before: 2, 4, 6 ms; after: 1, 1, 6 ms -> per-round before/after 2, 4, 1.
    return Timing(wall_s={"before": [2e-3, 4e-3, 6e-3], "after": [1e-3, 1e-3, 6e-3]},
                  cpu_s={"before": [2e-3, 2e-3, 2e-3], "after": [1e-3, 1e-3, 1e-3]})


def test_ab_rows_per_round_speedup():
    rows = ab.ab_rows("flags_ab softmax", "8x8 float32 fwd", _timing(), "before", "after", "after_vs_before", "n")
    assert [(r["variant"], r["metric"], r["unit"]) for r in rows] == [
        ("before", "wall_time", "ms"), ("after", "wall_time", "ms"),
        ("before", "cpu_time", "ms"), ("after", "cpu_time", "ms"), ("after_vs_before", "speedup_wall", "x")]
    assert all(r["benchmark"] == "flags_ab softmax" and r["shape"] == "8x8 float32 fwd" and r["notes"] == "n"
               for r in rows)
    # Inclusive deciles of 2, 4, 6: p20 at 0.4 of the way from 2 to 4, p80 at 0.6 from 4 to 6.
    assert [rows[0][k] for k in ("p20", "p50", "p80")] == pytest.approx([2.8, 4.0, 5.2])
    # Ratios sorted 1, 2, 4 (not the ratio of medians, 4/1): p20 1.4, p50 2, p80 3.2.
    assert [rows[-1][k] for k in ("p20", "p50", "p80")] == pytest.approx([1.4, 2.0, 3.2])


def test_ab_table_blank_for_baseline_ratio_for_the_others():
    timing = _timing()
    timing.wall_s["alt"] = [4e-3, 2e-3, 3e-3]  # ratios 0.5, 2, 2
    table = ab.ab_table(timing, "before")
    assert [r[0] for r in table] == ["before", "after", "alt"]
    assert table[0][1:4] == pytest.approx([2.8, 4.0, 5.2]) and table[0][4] == ""
    assert table[1][1:4] == pytest.approx([1.0, 1.0, 4.0])  # 1, 1, 6 ms: p80 at 0.6 from 1 to 6
    assert table[1][4] == "1.40/2.00/3.20"
    assert table[2][4] == "1.10/2.00/2.00"


def test_run_ab_appends_rows_and_prints_table(tmp_path, capsys):
    out = tmp_path / "ab.csv"
    timing = ab.run_ab({"old_flags": lambda: None, "new_flags": lambda: None}, baseline="old_flags",
                       candidate="new_flags", speedup_variant="new_vs_old_flags", benchmark="flags_ab noop",
                       shape="1x1", title="noop 1x1", threads=1, detail="snapshot test", csv=str(out), rounds=3,
                       inner=2, ratio_header="old/this p20/p50/p80")
    assert [len(v) for v in timing.wall_s.values()] == [3, 3]
    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 5 and rows[-1]["variant"] == "new_vs_old_flags" and rows[-1]["unit"] == "x"
    assert all(r["notes"].startswith("threads=1; load=") and r["notes"].endswith("; preallocated outputs; "
                                                                                   "snapshot test") for r in rows)
    printed = capsys.readouterr().out
    assert "noop 1x1 threads=1 load=" in printed and "old/this p20/p50/p80" in printed
