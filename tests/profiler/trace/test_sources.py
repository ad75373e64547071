"""Several ranks (lists, directories, zips, tars), bytes and file-likes, rank rules and clock alignment."""
from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
import zipfile

import numpy as np
import pytest

from profiler.trace import TraceError, load_trace
from tests.profiler.trace.conftest import HALF_NS_US, loaded, raw_truth, trace_named

RANK0 = trace_named("hta_a100_rank0of2_nccl")  # distributedInfo.rank = 0
RANK1 = trace_named("hta_v100_rank1of2")  # distributedInfo.rank = 1
NO_RANK_A = trace_named("tracelens_h100_bert_small")
NO_RANK_B = trace_named("hta_mi250")


def _kernels_by_rank(tr):
    k = tr.events[tr.events["kind"] == "kernel"]
    return k.groupby("rank")["dur_us"].agg(["count", "sum"])


def test_two_ranks_align_on_the_earliest_event():
    tr = load_trace([RANK1, RANK0])
    t0 = min(raw_truth(RANK0)["first_ts"], raw_truth(RANK1)["first_ts"])
    t0_exact = min(raw_truth(RANK0)["ts_exact"][0], raw_truth(RANK1)["ts_exact"][0])
    assert tr.ranks == (0, 1) and tr.meta["t0_us"] == t0
    assert tr.events["ts_us"].min() == 0.0
    per = _kernels_by_rank(tr)
    for rank, path in ((0, RANK0), (1, RANK1)):
        assert per.loc[rank, "count"] == raw_truth(path)["kernel_count"]
        assert per.loc[rank, "sum"] == pytest.approx(raw_truth(path)["kernel_total_us"], rel=1e-12)
        ts = np.sort(tr.events.loc[tr.events["rank"] == rank, "ts_us"].to_numpy())
        want = [float(t - t0_exact) for t in raw_truth(path)["ts_exact"]]  # sorted
        assert np.abs(ts - want).max() <= HALF_NS_US
        assert tr.meta["per_rank"][rank]["source"] == str(path)
        assert tr.meta["per_rank"][rank]["rank_source"] == "distributedInfo.rank"
    assert tr.meta["sources"] == (str(RANK1), str(RANK0))


def test_same_rank_twice_is_an_error(tmp_path):
    copy = tmp_path / "again.json.gz"
    shutil.copy(RANK0, copy)
    msg = str(pytest.raises(TraceError, load_trace, [RANK0, copy]).value)
    assert "both claim rank 0" in msg and "again.json.gz" in msg


def test_files_without_rank_get_the_lowest_free_rank():
    tr = load_trace([NO_RANK_A, RANK0, NO_RANK_B])
    assert tr.ranks == (0, 1, 2)
    assert tr.meta["per_rank"][0]["source"] == str(RANK0)
    assert tr.meta["per_rank"][1]["source"] == str(NO_RANK_A)
    assert tr.meta["per_rank"][2]["rank_source"].startswith("default")


def test_rank_override():
    tr = load_trace([NO_RANK_A, NO_RANK_B], rank=[5, 3])
    assert tr.ranks == (3, 5) and tr.meta["per_rank"][5]["source"] == str(NO_RANK_A)
    with pytest.raises(TraceError):
        load_trace([NO_RANK_A, NO_RANK_B], rank=[1, 1])
    with pytest.raises(TraceError):
        load_trace([NO_RANK_A, NO_RANK_B], rank=4)


@pytest.mark.parametrize("bad", [2**31, 2**63, -1, 1.5, "3", True])
def test_a_distributed_rank_out_of_range_counts_as_absent(bad):
    """The rank column is int32: distributedInfo.rank 2^63 raised OverflowError from numpy
    (found by tests/profiler/trace/fuzz_ingest.py); such a rank is now no rank at all."""
    doc = json.loads(gzip.decompress(NO_RANK_A.read_bytes()))
    doc["distributedInfo"] = {"rank": bad, "world_size": 2}
    tr = load_trace(json.dumps(doc).encode())
    assert tr.ranks == (0,) and tr.meta["per_rank"][0]["rank_source"].startswith("default")


def test_a_callers_rank_out_of_range_is_one_line():
    for bad in (2**31, -1):
        msg = str(pytest.raises(TraceError, load_trace, NO_RANK_A, rank=bad).value)
        assert "between 0 and 2147483647" in msg and "\n" not in msg


def test_directory_of_ranks(tmp_path):
    shutil.copy(RANK0, tmp_path / "r0.json.gz")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "r1.json").write_bytes(gzip.decompress(RANK1.read_bytes()))
    (tmp_path / "notes.txt").write_text("not a trace")
    tr = load_trace(tmp_path)
    assert tr.ranks == (0, 1) and len(tr.events) == len(loaded(RANK0).events) + len(loaded(RANK1).events)


def test_zip_of_ranks(tmp_path):
    path = tmp_path / "ranks.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("run/rank0.json.gz", RANK0.read_bytes())
        zf.writestr("run/rank1.json", gzip.decompress(RANK1.read_bytes()))
        zf.writestr("run/README.txt", "ignored")
    for source in (path, path.read_bytes(), io.BytesIO(path.read_bytes())):
        tr = load_trace(source)
        assert tr.ranks == (0, 1)
        assert _kernels_by_rank(tr)["count"].tolist() == [raw_truth(RANK0)["kernel_count"],
                                                          raw_truth(RANK1)["kernel_count"]]
    assert load_trace(path).meta["sources"][0].endswith("ranks.zip!run/rank0.json.gz")


def _tar(path, members: dict, mode: str = "w") -> None:
    """A tar at `path` with {name: bytes} regular members (mode "w:gz" for a .tar.gz)."""
    with tarfile.open(path, mode) as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("mode, name", [("w", "ranks.tar"), ("w:gz", "ranks.tar.gz"), ("w:gz", "ranks.tgz")])
def test_tar_of_ranks(tmp_path, mode, name):
    """Traces are often shared as a .tar.gz of a run's folder: its .json / .json.gz members load as
    ranks, with macOS's ._ resource forks, links and other files passed over."""
    path = tmp_path / name
    _tar(path, {"run/rank0.json.gz": RANK0.read_bytes(), "run/rank1.json": gzip.decompress(RANK1.read_bytes()),
                "run/._rank1.json": b"\x00\x05\x16\x07 resource fork", "run/README.txt": b"ignored"}, mode)
    with tarfile.open(path, "a" if mode == "w" else "r") as tf:
        if mode == "w":  # a symlink member (to a trace): not followed
            link = tarfile.TarInfo("run/link.json")
            link.type, link.linkname = tarfile.SYMTYPE, "rank1.json"
            tf.addfile(link)
    for source in (path, path.read_bytes(), io.BytesIO(path.read_bytes())):
        tr = load_trace(source)
        assert tr.ranks == (0, 1)
        assert _kernels_by_rank(tr)["count"].tolist() == [raw_truth(RANK0)["kernel_count"],
                                                          raw_truth(RANK1)["kernel_count"]]
    assert list(load_trace(path).meta["sources"]) == [f"{path}!run/rank0.json.gz", f"{path}!run/rank1.json"]


@pytest.mark.parametrize("order", ["by_name", "reversed"])
def test_small_tar_members_sharing_pages_load_whole(tmp_path, order):
    """Members of a few KB share the archive's pages; decoding one hands pages back (when names and
    offsets agree), which must never take a byte of a member not decoded yet. Twelve ranks, each
    alone and all from a .tar.gz (whose decompressed pages are zero-filled once handed back)."""
    docs = {f"r{i:02d}.json": json.dumps({"distributedInfo": {"rank": i}, "traceEvents": [
        {"ph": "X", "cat": "kernel", "name": f"k{i}_{j}", "pid": 0, "tid": 7, "ts": 1000 + 10 * j, "dur": 3 + i,
         "args": {"device": 0, "stream": 7, "correlation": 100 * i + j}} for j in range(20 + 7 * i)]}).encode()
        for i in range(12)}
    names = sorted(docs) if order == "by_name" else sorted(docs, reverse=True)
    _tar(tmp_path / "ranks.tar.gz", {n: docs[n] for n in names}, "w:gz")
    tr = load_trace(tmp_path / "ranks.tar.gz")
    assert tr.ranks == tuple(range(12))
    k = tr.events[tr.events["kind"] == "kernel"]
    for i, name in enumerate(sorted(docs)):
        alone = load_trace(docs[name]).events
        mine = k[k["rank"] == i]
        assert mine["name"].astype(str).tolist() == alone[alone["kind"] == "kernel"]["name"].astype(str).tolist()
        assert mine["dur_us"].tolist() == [3.0 + i] * (20 + 7 * i)


def test_a_json_with_ustar_at_the_tar_magic_offset_is_still_json():
    """Tars are sniffed by "ustar" at byte 257 and the header checksum; a kernel name that puts
    "ustar" there must not make a JSON trace look like a broken tar."""
    head = '{"traceEvents": [{"ph": "X", "name": "'
    name = "x" * (257 - len(head)) + "ustar_kernel"
    doc = head + name + '", "cat": "kernel", "pid": 0, "tid": 7, "ts": 1, "dur": 2, "args": {"device": 0}}]}'
    data = doc.encode() + b" " * 600
    assert data[257:262] == b"ustar"
    tr = load_trace(data)
    assert tr.events["name"].astype(str).tolist() == [name]


def test_bad_tars_are_one_line(tmp_path):
    one = gzip.decompress(RANK1.read_bytes())
    cases = {"outside.tar": ({"../evil.json": one}, "absolute or '..' path"),
             "absolute.tar": ({"/etc/evil.json": one}, "absolute or '..' path"),
             "empty.tar": ({"notes.txt": b"hello"}, "holds no .json or .json.gz trace")}
    for name, (members, words) in cases.items():
        _tar(tmp_path / name, members)
        with pytest.raises(TraceError, match=words):
            load_trace(tmp_path / name)
    _tar(tmp_path / "good.tar", {"rank1.json": one})
    good = (tmp_path / "good.tar").read_bytes()
    damaged = bytearray(good)
    damaged[148:156] = b"garbage!"  # the header's checksum
    for bad in (bytes(damaged), good[:700]):  # a bad checksum; a member cut short
        with pytest.raises(TraceError) as info:
            load_trace(bad)
        assert "\n" not in str(info.value) and "<bytes>" in str(info.value)
    bomb = tmp_path / "bomb.tar.gz"
    _tar(bomb, {"r.json.gz": gzip.compress(b'{"traceEvents": [' + b" " * (8 << 20) + b"]}")}, "w:gz")
    with pytest.raises(TraceError, match="bomb.tar.gz!r.json.gz: decompressed data exceeds the limit"):
        load_trace(bomb, max_decompressed_bytes=1 << 20)


def test_json_beside_the_traces_that_is_not_one_is_passed_over(tmp_path):
    """A run folder often holds a config.json or metrics next to its traces: in a directory, zip or
    tar, valid JSON without traceEvents is passed over (and listed in meta) instead of failing the
    whole load; a file named by the caller still has to be a trace, and a folder of only such JSON
    is one error."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(RANK0, run / "rank0.json.gz")
    (run / "rank1.json").write_bytes(gzip.decompress(RANK1.read_bytes()))
    (run / "config.json").write_text(json.dumps({"lr": 0.1, "layers": 2}))
    (run / "metrics.json").write_text(json.dumps({"loss": [2.5, 2.1], "traceEvents": None}))
    zipped = tmp_path / "run.zip"
    with zipfile.ZipFile(zipped, "w") as zf:
        for f in sorted(run.iterdir()):
            zf.write(f, f"run/{f.name}")
    _tar(tmp_path / "run.tgz", {f"run/{f.name}": f.read_bytes() for f in sorted(run.iterdir())}, "w:gz")
    for source in (run, zipped, tmp_path / "run.tgz", zipped.read_bytes()):
        tr = load_trace(source)
        assert tr.ranks == (0, 1)
        assert _kernels_by_rank(tr)["count"].tolist() == [raw_truth(RANK0)["kernel_count"],
                                                          raw_truth(RANK1)["kernel_count"]]
        over = tr.meta["passed_over_files"]
        assert len(over) == 2 and "config.json: JSON that is not a trace" in over[0], over
        assert "metrics.json: JSON that is not a trace" in over[1], over
    assert not loaded(RANK0).meta["passed_over_files"]
    with pytest.raises(TraceError, match="config.json: JSON that is not a trace"):
        load_trace([RANK0, run / "config.json"])  # named by the caller
    only = tmp_path / "only"
    only.mkdir()
    (only / "a.json").write_text("{}")
    (only / "b.json").write_text("{}")
    with pytest.raises(TraceError, match=r"a.json: JSON that is not a trace: no traceEvents list \(and 1 more such "
                                         r"file\(s\)\); no trace found"):
        load_trace(only)


def test_bytes_file_like_and_plain_json_agree():
    ref = loaded(NO_RANK_A)
    raw_gz = NO_RANK_A.read_bytes()
    for source in (raw_gz, gzip.decompress(raw_gz), io.BytesIO(raw_gz), bytearray(gzip.decompress(raw_gz))):
        tr = load_trace(source)
        assert tr.events.equals(ref.events)
        assert tr.meta["t0_us"] == ref.meta["t0_us"]


def test_chrome_array_format_and_events_without_args(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 5, "dur": 2},
              {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": "stream 3", "ts": 6.5, "dur": 1}]
    path = tmp_path / "array.json"
    path.write_text(json.dumps(events))
    tr = load_trace(path)
    assert len(tr.events) == 2 and tr.meta["t0_us"] == 5.0
    k = tr.events[tr.events["kind"] == "kernel"].iloc[0]
    assert k["stream"] == 3 and k["device"] == 0 and k["ts_us"] == 1.5


def test_many_chunks_with_boundaries_inside_strings(tmp_path, monkeypatch):
    """Chunk splits that land inside an event or a string are widened, never mis-decoded."""
    import profiler.trace.decode as decode

    monkeypatch.setattr(decode, "CHUNK_BYTES", 300)
    events = [{"ph": "X", "cat": "cpu_op", "name": "op}, {" + str(i), "pid": 1, "tid": 1, "ts": i, "dur": 1,
               "args": {"Input Dims": [[i, 2], []], "nested": [{"a": 1}, {"b": 2}]}} for i in range(400)]
    path = tmp_path / "chunks.json"
    path.write_text(json.dumps({"traceEvents": events}, indent=1))
    tr = load_trace(path)
    assert len(tr.events) == 400 and tr.meta["skipped_events"] == 0
    assert sorted(tr.events["name"].astype(str)) == sorted(e["name"] for e in events)
    assert set(tr.events["input_dims"]) == {f"[[{i},2],[]]" for i in range(400)}


def test_multi_member_gzip_and_gzip_bytes_agree(tmp_path):
    """Concatenated gzip members decode whole (the trailer's size hint covers only the last one)."""
    plain = gzip.decompress(NO_RANK_B.read_bytes())
    cut = len(plain) // 3
    path = tmp_path / "multi.json.gz"
    path.write_bytes(gzip.compress(plain[:cut]) + gzip.compress(plain[cut:]))
    ref = loaded(NO_RANK_B)
    for source in (path, path.read_bytes()):
        tr = load_trace(source)
        assert tr.events.equals(ref.events) and tr.meta["t0_us"] == ref.meta["t0_us"]


def test_utf8_byte_order_mark_is_accepted(tmp_path):
    doc = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k\u00e9", "pid": 0, "tid": 7, "ts": 1, "dur": 2}]}
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(doc, ensure_ascii=False).encode())
    tr = load_trace(path)
    assert list(tr.events["name"].astype(str)) == ["k\u00e9"]
