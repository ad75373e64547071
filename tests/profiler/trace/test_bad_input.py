"""Bad input: one TraceError with one human line naming the file; bad events skipped and counted."""
from __future__ import annotations

import gzip
import io
import json
import time
import zipfile

import pytest

from profiler.trace import TraceError, load_trace
from tests.profiler.trace.conftest import trace_named


def _kernel(i, **over):
    e = {"ph": "X", "cat": "kernel", "name": f"k{i % 3}", "pid": 0, "tid": 7, "ts": 1000.0 + 10 * i,
         "dur": 5.0, "args": {"device": 0, "stream": 7, "correlation": i}}
    e.update(over)
    return e


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def _error(source, **kw) -> str:
    with pytest.raises(TraceError) as info:
        load_trace(source, **kw)
    msg = str(info.value)
    assert "\n" not in msg and len(msg) < 400
    return msg


@pytest.mark.parametrize("content", [b"", b"  \n\t "])
def test_empty_file(tmp_path, content):
    path = _write(tmp_path, "empty.json", content)
    msg = _error(path)
    assert "empty.json" in msg and "empty" in msg


def test_empty_bytes_and_file_like():
    assert "empty" in _error(b"")
    assert "empty" in _error(io.BytesIO(b""))


@pytest.mark.parametrize("text", ['{"traceEvents": [', '{"traceEvents": [}', "{'traceEvents': []}", "nul"])
def test_invalid_json(tmp_path, text):
    msg = _error(_write(tmp_path, "bad.json", text))
    assert "bad.json" in msg and "invalid JSON" in msg


def test_nan_is_not_json(tmp_path):
    text = json.dumps({"traceEvents": [_kernel(0, dur=float("nan"))]})  # Python writes NaN
    msg = _error(_write(tmp_path, "nan.json", text))
    assert "NaN" in msg and "nan.json" in msg


@pytest.mark.parametrize("doc,words", [({"foo": 1}, "no traceEvents"), (42, "not a trace"),
                                       ("text", "not a trace"), ({"traceEvents": 5}, "not a list"),
                                       ({"traceEvents": {"a": 1}}, "not a list")])
def test_json_that_is_not_a_trace(tmp_path, doc, words):
    msg = _error(_write(tmp_path, "other.json", json.dumps(doc)))
    assert "other.json" in msg and words in msg


def test_array_of_non_events_is_not_a_trace(tmp_path):
    msg = _error(_write(tmp_path, "nums.json", json.dumps([1, 2, 3])))
    assert "nums.json" in msg and "unreadable" in msg


def test_truncated_gzip(tmp_path):
    data = trace_named("tracelens_h100_bert_small").read_bytes()
    msg = _error(_write(tmp_path, "cut.json.gz", data[: len(data) // 2]))
    assert "cut.json.gz" in msg and "truncated gzip" in msg


def test_corrupt_gzip(tmp_path):
    data = bytearray(gzip.compress(json.dumps({"traceEvents": [_kernel(i) for i in range(100)]}).encode()))
    data[20:40] = b"\xff" * 20
    msg = _error(_write(tmp_path, "corrupt.json.gz", bytes(data)))
    assert "corrupt.json.gz" in msg and "gzip" in msg


def test_a_handful_of_bad_events_are_skipped_and_counted(tmp_path):
    events = [_kernel(i) for i in range(100)]
    events[3]["ts"] = "soon"  # wrong type
    del events[5]["dur"]  # missing field
    events[7]["name"] = 12  # wrong type
    events[9]["dur"] = -4.0  # absurd: negative duration
    events[11]["args"]["correlation"] = 2**70  # integer beyond int64
    events[13]["ts"] = 1e300  # absurd timestamp
    events.append(17)  # not an object
    tr = load_trace(_write(tmp_path, "some_bad.json", json.dumps({"traceEvents": events})))
    assert len(tr.events) == 94 and tr.meta["skipped_events"] == 7
    reasons = tr.meta["skipped_reasons"]
    assert sum(reasons.values()) == 7 and reasons["negative dur"] == 1
    assert any("ts" in r for r in reasons) and any("correlation" in r for r in reasons)
    assert any("absurd" in r for r in reasons) and any("name" in r for r in reasons)
    assert set(tr.events["correlation"].astype(int)) == set(range(100)) - {3, 5, 7, 9, 11, 13}


def test_mostly_bad_events_fail_the_file(tmp_path):
    events = [_kernel(i, dur=-1.0) for i in range(30)] + [_kernel(99)]
    msg = _error(_write(tmp_path, "absurd.json", json.dumps({"traceEvents": events})))
    assert "absurd.json" in msg and "30 of 31" in msg and "negative dur" in msg


def test_integers_beyond_int64_everywhere_fail(tmp_path):
    events = [_kernel(i, pid=2**64 + i) for i in range(20)]
    msg = _error(_write(tmp_path, "huge.json", json.dumps({"traceEvents": events})))
    assert "huge.json" in msg and "pid" in msg


def test_decompression_bomb_is_refused_quickly(tmp_path):
    bomb = gzip.compress(b'{"traceEvents": [' + b" " * (64 << 20) + b"]}", compresslevel=1)
    path = _write(tmp_path, "bomb.json.gz", bomb)
    t0 = time.perf_counter()
    msg = _error(path, max_decompressed_bytes=4 << 20)
    assert time.perf_counter() - t0 < 5.0
    assert "bomb.json.gz" in msg and "exceeds the limit" in msg


def test_plain_file_over_the_limit_is_refused(tmp_path):
    path = _write(tmp_path, "big.json", json.dumps({"traceEvents": [_kernel(i) for i in range(2000)]}))
    assert "exceeds the limit" in _error(path, max_decompressed_bytes=10_000)


def test_zip_bomb_member_is_refused(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("rank0.json", b'{"traceEvents": [' + b" " * (32 << 20) + b"]}")
    msg = _error(_write(tmp_path, "bomb.zip", buf.getvalue()), max_decompressed_bytes=1 << 20)
    assert "bomb.zip!rank0.json" in msg and "exceeds the limit" in msg


@pytest.mark.parametrize("member", ["../evil.json", "/etc/evil.json", "a/../../evil.json", "C:\\evil.json"])
def test_zip_member_paths_outside_are_refused(tmp_path, member):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("ok.json", json.dumps({"traceEvents": [_kernel(0)]}))
        zf.writestr(member, json.dumps({"traceEvents": [_kernel(0)]}))
    msg = _error(_write(tmp_path, "paths.zip", buf.getvalue()))
    assert "paths.zip" in msg and "absolute or '..' path" in msg


def _zip_bytes(method=zipfile.ZIP_DEFLATED) -> bytearray:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as zf:
        zf.writestr("rank0.json", json.dumps({"traceEvents": [_kernel(i) for i in range(200)]}))
    return bytearray(buf.getvalue())


def _set_both_headers(data: bytearray, offset: int, value: bytes) -> bytearray:
    """Write `value` at `offset` of the local header and at the same field of the central one
    (local flags / method at 6 / 8 sit at 8 / 10 in the central record)."""
    data[offset:offset + len(value)] = value
    cd = data.rfind(b"PK\x01\x02")
    data[cd + offset + 2:cd + offset + 2 + len(value)] = value
    return data


def _damaged_zips() -> dict[str, tuple[bytes, str]]:
    """{case: (zip bytes, words the error must contain)}: each used to escape load_trace as
    zipfile's or a decompressor's own exception (a zip-byte fuzzer, 2026-12-04)."""
    encrypted = _zip_bytes()
    encrypted[6] |= 1
    encrypted = _set_both_headers(encrypted, 6, bytes([encrypted[6]]) + bytes(encrypted[7:8]))
    method = _set_both_headers(_zip_bytes(), 8, (99).to_bytes(2, "little"))
    bz2_bad = _zip_bytes(zipfile.ZIP_BZIP2)
    start = 30 + len("rank0.json")  # the member's data: a bzip2 stream ("BZh9...")
    assert bz2_bad[start:start + 3] == b"BZh"
    bz2_bad[start:start + 4] = b"XXXX"
    lzma_bad = _zip_bytes(zipfile.ZIP_LZMA)
    lzma_bad[start + 4:start + 9] = b"\xff" * 5  # the LZMA properties
    seek = _zip_bytes()
    eocd = seek.rfind(b"PK\x05\x06")
    offset = int.from_bytes(seek[eocd + 16:eocd + 20], "little")  # where the central directory starts
    seek[eocd + 16:eocd + 20] = (offset + (1 << 24)).to_bytes(4, "little")  # members now "before" byte 0
    return {"encrypted": (bytes(encrypted), "encrypted zip member"),
            "method 99": (bytes(method), "compressed with a method"),
            "bzip2 data": (bytes(bz2_bad), "corrupt zip member"),
            "lzma data": (bytes(lzma_bad), "corrupt zip member"),
            "directory offset": (bytes(seek), "corrupt zip member")}


@pytest.mark.parametrize("case", sorted(_damaged_zips()))
def test_damaged_or_unsupported_zip_is_one_line(tmp_path, case):
    """An encrypted member, a compression method Python lacks, damaged bzip2 / LZMA data and a
    directory offset that makes zipfile seek before the file's start: one TraceError naming the
    archive (and member), from bytes and from a path alike."""
    data, words = _damaged_zips()[case]
    for source in (data, _write(tmp_path, "damaged.zip", data)):
        msg = _error(source)
        assert words in msg, msg
        assert ("damaged.zip" in msg) or ("<bytes>" in msg), msg


def test_missing_file_and_unreadable_source(tmp_path):
    assert "no such file" in _error(tmp_path / "nope.json")
    assert "cannot read a trace" in _error(12345)
    assert "no trace given" in _error([])
    assert "holds no" in _error(tmp_path)  # an empty directory


def test_invalid_json_inside_an_array_format_trace(tmp_path, monkeypatch):
    import profiler.trace.decode as decode

    monkeypatch.setattr(decode, "CHUNK_BYTES", 500)  # many chunks: the bad one is found by widening
    good = ",\n".join(json.dumps(_kernel(i)) for i in range(300))
    msg = _error(_write(tmp_path, "arr.json", "\n  [" + good + ",\n {\"ph\": \"X\", oops}]"))
    assert "arr.json" in msg and "invalid JSON" in msg
    tr = load_trace(_write(tmp_path, "arr_ok.json", "\n  [" + good + "]\n"))
    assert len(tr.events) == 300


def test_invalid_utf8_inside_side_fields_loads(tmp_path):
    """Bytes that are not UTF-8 inside fields the row decoder keeps raw (an op's Input Dims) or
    never reads (a counter's args) escaped load_trace as UnicodeDecodeError and msgspec's
    DecodeError (trace fuzzer seeds 211236 and 210221). The rows load, the raw field keeps U+FFFD,
    and only the broken counter sample is left out."""
    op = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 0, "tid": 1, "ts": 990.0, "dur": 300.0,
          "args": {"Input Dims": [[2, 3], "DIMS"]}}
    broken = {"ph": "C", "name": "mem", "pid": 0, "ts": 1000.0, "args": {"a": 1, "b": "COUNTER"}}
    good = {"ph": "C", "name": "mem2", "pid": 0, "ts": 1000.0, "args": {"a": 1}}
    data = json.dumps({"traceEvents": [_kernel(i) for i in range(20)] + [op, broken, good]}).encode()
    data = data.replace(b"COUNTER", b"\xff\xfe").replace(b"DIMS", b"x\xe5y")
    tr = load_trace(_write(tmp_path, "utf8.json", data))
    kinds = tr.events.kind.value_counts()
    assert kinds["kernel"] == 20 and kinds["cpu_op"] == 1
    assert "\ufffd" in tr.events.loc[tr.events.kind == "cpu_op", "input_dims"].iloc[0]
    assert tr.counters.name.astype(str).tolist() == ["mem2"]


def _foreign_chrome_trace() -> dict:
    """The shape of a JAX / TensorFlow profiler trace: Chrome trace events without Kineto categories."""
    return {"displayTimeUnit": "ns", "traceEvents": [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "X", "pid": 1, "tid": 1, "name": "fusion.12", "ts": 1000.5, "dur": 12.25},
        {"ph": "X", "pid": 1, "tid": 1, "name": "gemm", "ts": 1020.5, "dur": 42.25},
        {"ph": "X", "pid": 2, "tid": 7, "cat": "XLA Ops", "name": "PjitFunction(step)", "ts": 990, "dur": 100},
        {"ph": "B", "pid": 2, "tid": 7, "name": "step", "ts": 980}, {"ph": "E", "pid": 2, "tid": 7, "ts": 1200},
        {"ph": "C", "pid": 1, "name": "memory", "ts": 1000, "args": {"bytes": 5}}]}


def test_a_chrome_trace_of_another_tool_is_one_line_not_an_empty_trace(tmp_path):
    """A JAX/TensorFlow Chrome trace has traceEvents, none of them Kineto's: it used to load as a
    Trace of 0 events with nothing said; now it is refused, saying what it held."""
    path = _write(tmp_path, "jax.trace.json", json.dumps(_foreign_chrome_trace()))
    msg = _error(path)
    assert msg.endswith("jax.trace.json: not a PyTorch profiler (Kineto) trace: none of its 5 events is of a kind "
                        'FusionLens reads (seen: (no category) x2, "XLA Ops" x1, ph "B" events x1, ph "E" events x1)'), msg


def test_a_foreign_trace_beside_kineto_ones_is_passed_over(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank0.json.gz").write_bytes(trace_named("tracelens_h100_bert_small").read_bytes())
    (run / "jax.json").write_text(json.dumps(_foreign_chrome_trace()))
    tr = load_trace(run)
    assert tr.ranks == (0,) and len(tr.events) > 0
    over = tr.meta["passed_over_files"]
    assert len(over) == 1 and "jax.json: not a PyTorch profiler (Kineto) trace" in over[0], over


def test_a_kineto_trace_with_only_its_own_span_loads_empty():
    """Kineto's whole-capture span (category "Trace") is not an event of the run: a profile that
    recorded nothing is an empty Trace, as before, with nothing unread."""
    doc = {"traceEvents": [{"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
                            "tid": "PyTorch Profiler", "ts": 5.0, "dur": 10.0}]}
    tr = load_trace(json.dumps(doc).encode())
    assert len(tr.events) == 0 and dict(tr.meta["unread_events"]) == {}


def test_events_of_kinds_not_modelled_are_counted_and_the_rest_loads_unchanged():
    """Runtime events of another backend (Kineto's xpu_runtime), Chrome B/E pairs and events
    without a category, inside a real Kineto trace: counted by label per file and in total; every
    other row as without them."""
    path = trace_named("tracelens_h100_bert_small")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    t = doc["traceEvents"][10]["ts"]
    extra = ([{"ph": "X", "cat": "xpu_runtime", "name": "zeCommandListAppendLaunchKernel", "pid": 1, "tid": 1,
               "ts": t, "dur": 3}] * 4
             + [{"ph": "B", "name": "b", "pid": 1, "tid": 1, "ts": t}, {"ph": "E", "pid": 1, "tid": 1, "ts": t + 1},
                {"ph": "X", "name": "no cat", "pid": 1, "tid": 1, "ts": t, "dur": 1}])
    events = doc["traceEvents"]
    for i, e in enumerate(extra):
        events.insert(1 + i * (len(events) // len(extra)), e)
    tr = load_trace(json.dumps(doc).encode())
    want = {'"xpu_runtime"': 4, 'ph "B" events': 1, 'ph "E" events': 1, "(no category)": 1}
    assert dict(tr.meta["unread_events"]) == want
    assert dict(tr.meta["per_rank"][0]["unread_events"]) == want
    assert list(tr.meta["unread_events"])[0] == '"xpu_runtime"'  # most frequent first
    plain = load_trace(path)
    assert tr.events.equals(plain.events) and tr.meta["skipped_events"] == 0


def test_unread_labels_are_bounded():
    """A damaged file with thousands of made-up categories cannot grow the meta: 20 labels at most,
    the rest counted together, long ones cut; the counts still add up."""
    from profiler.trace import _columns as C

    events = [_kernel(0)] + [{"ph": "X", "cat": f"cat{i}" + "x" * (100 * (i == 3)), "name": "e", "pid": 1,
                              "tid": 1, "ts": 1.0, "dur": 1.0} for i in range(500)]
    tr = load_trace(json.dumps({"traceEvents": events}).encode())
    unread = dict(tr.meta["unread_events"])
    assert len(unread) == C.MAX_UNREAD_LABELS and sum(unread.values()) == 500
    assert unread[C.UNREAD_OTHER] == 500 - (C.MAX_UNREAD_LABELS - 1)
    assert max(map(len, unread)) <= 60 and any(k.endswith("…") for k in unread)


def test_unread_labels_are_bounded_over_several_files():
    """Two ranks with 15 made-up categories each: the Trace's total keeps to the same 20 labels
    (each rank keeps its own 15), and the counts still add up."""
    from profiler.trace import _columns as C

    docs = [json.dumps({"traceEvents": [_kernel(0)] + [
        {"ph": "X", "cat": f"r{r}c{i}", "name": "e", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0} for i in range(15)]}
    ).encode() for r in range(2)]
    tr = load_trace(docs)
    assert [len(tr.meta["per_rank"][r]["unread_events"]) for r in (0, 1)] == [15, 15]
    unread = dict(tr.meta["unread_events"])
    assert len(unread) == C.MAX_UNREAD_LABELS and sum(unread.values()) == 30
    assert unread[C.UNREAD_OTHER] == 30 - (C.MAX_UNREAD_LABELS - 1)


def test_unread_labels_stay_on_one_line(tmp_path):
    """A category with a line break or control characters (JSON escapes) ends up in a one-line error."""
    events = [{"ph": "X", "cat": "a\nb\u2028c\x1ed\te", "name": "e", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0}]
    msg = _error(_write(tmp_path, "odd.json", json.dumps({"traceEvents": events})))
    assert msg.endswith('(seen: "a?b?c?d?e" x1)') and len(msg.splitlines()) == 1, msg


def _sqlite_bytes(tmp_path) -> bytes:
    import sqlite3

    db = tmp_path / "export.sqlite"
    con = sqlite3.connect(db)
    con.execute("create table CUPTI_ACTIVITY_KIND_KERNEL (start int, end int)")
    con.commit()
    con.close()
    return db.read_bytes()


def _pickle_bytes(tmp_path) -> bytes:
    import pickle

    return pickle.dumps({"segments": [], "device_traces": [[]]}, protocol=4)  # a memory snapshot's shape


@pytest.mark.parametrize("name, make, words", [
    ("export.sqlite", _sqlite_bytes, "an SQLite database (an Nsight Systems"),
    ("snapshot.pickle", _pickle_bytes, "a Python pickle (a CUDA memory snapshot"),
    ("trace.json.zst", lambda _: b"\x28\xb5\x2f\xfd" + bytes(20), "zstd-compressed data"),
    ("trace.json.bz2", lambda _: __import__("bz2").compress(b'{"traceEvents": []}'), "bzip2-compressed data"),
    ("trace.json.xz", lambda _: __import__("lzma").compress(b'{"traceEvents": []}'), "xz-compressed data"),
    ("events.parquet", lambda _: b"PAR1" + bytes(40) + b"PAR1", "a Parquet file"),
    ("blob.bin", lambda _: b"\x01\x02\x00\x00garbage", "binary data, not JSON text"),
])
def test_files_of_other_kinds_are_named(tmp_path, name, make, words):
    """A file handed over by mistake (an Nsight SQLite export, a memory snapshot pickle, a trace
    compressed with something other than gzip) is named in the one line, also inside a .gz."""
    import gzip as gz

    data = make(tmp_path)
    for label, payload in ((name, data), (name + ".gz", gz.compress(data))):
        msg = _error(_write(tmp_path, label, payload))
        assert f"{label}: not a JSON trace: {words}" in msg, msg


def test_text_that_is_not_json_keeps_the_parsers_message(tmp_path):
    msg = _error(_write(tmp_path, "notes.json", "Traces are in /data/run1\n"))
    assert msg.endswith("notes.json: invalid JSON (invalid character (byte 0))"), msg


def test_a_torch_checkpoint_is_named(tmp_path):
    """torch.save writes a zip (`<name>/data.pkl` and the tensors): said so, not just 'no trace'."""
    import torch

    torch.save({"w": torch.ones(3)}, tmp_path / "model.pt")
    msg = _error(tmp_path / "model.pt")
    assert msg.endswith("model.pt: the zip archive holds no .json or .json.gz trace (a torch.save checkpoint: "
                        "its tensors, not a profile)"), msg
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as zf:
        zf.writestr("notes.txt", "hello")
    assert _error(tmp_path / "other.zip").endswith("other.zip: the zip archive holds no .json or .json.gz trace")
