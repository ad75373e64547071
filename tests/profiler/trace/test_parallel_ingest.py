"""The parallel decode of a plain .json trace gives exactly the serial Trace.

Real traces are written uncompressed to tmp_path and loaded twice: in this process only
(`workers=1`) and with worker processes forced on (a tiny `parallel_min_bytes`, and small chunks so
that even a small trace spans several chunks and each worker gets some). The parallel path must be
taken (spied on), and every table, dtype, category list and meta entry must match.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profiler.trace import _parallel as P
from profiler.trace import decode, load_trace
from profiler.trace.sources import Payload
from tests.profiler.trace.conftest import trace_named


def _plain_copy(src: Path, tmp_path: Path) -> Path:
    out = tmp_path / (src.name.removesuffix(".gz"))
    out.write_bytes(gzip.decompress(src.read_bytes()))
    return out


@pytest.fixture
def spy(monkeypatch):
    """Counts parallel decodes that completed (a fallback to serial would not count)."""
    done = []
    real = P.decode_parallel

    def wrapped(*args, **kwargs):
        total = real(*args, **kwargs)
        done.append((len(args[3]), total))
        return total

    monkeypatch.setattr(P, "decode_parallel", wrapped)
    return done


def _assert_same(par, ser) -> None:
    a, b = par.events, ser.events
    assert list(a.columns) == list(b.columns)
    assert a.dtypes.equals(b.dtypes)
    for col in a.columns:
        if isinstance(a[col].dtype, pd.CategoricalDtype):
            assert list(a[col].cat.categories) == list(b[col].cat.categories), col
            assert np.array_equal(a[col].cat.codes.to_numpy(), b[col].cat.codes.to_numpy()), col
    assert a.equals(b)
    assert par.memory.equals(ser.memory) and par.memory.dtypes.equals(ser.memory.dtypes)
    assert par.counters.equals(ser.counters) and par.counters.dtypes.equals(ser.counters.dtypes)
    assert par.meta == ser.meta


@pytest.mark.parametrize("prefix, chunk_bytes, workers", [
    ("kineto_v100_resnet50", 1 << 20, 2),  # the 2021 format
    ("hta_mi250_minitoy_train_rocm6.2", 4 << 10, 3),  # AMD ROCm, three processes
    ("hta_a100_rank0of2_nccl_data", 512 << 10, 2),  # NCCL collectives, counters
    ("tracelens_amd_vllm_decode_hipgraph_replay", 32 << 10, 2),
])
def test_parallel_equals_serial_on_real_traces(prefix, chunk_bytes, workers, tmp_path, monkeypatch, spy):
    monkeypatch.setattr(decode, "CHUNK_BYTES", chunk_bytes)
    path = _plain_copy(trace_named(prefix), tmp_path)
    ser = load_trace(path, workers=1)
    par = load_trace(path, workers=workers, parallel_min_bytes=1)
    assert [w for w, _ in spy] == [workers - 1], "the parallel path was not taken"
    assert spy[0][1] == len(json.loads(path.read_bytes())["traceEvents"])  # every event decoded once
    assert len(par.events) > 0
    _assert_same(par, ser)


def _planted_serial_and_parallel(planted: list, tmp_path, monkeypatch):
    """The NCCL trace with 8 of `planted` (in turn) spread evenly over it, loaded serially and by 2
    processes (small chunks: every process gets some)."""
    doc = json.loads(gzip.decompress(trace_named("hta_a100_rank0of2_nccl_data").read_bytes()))
    events = doc["traceEvents"]
    step = len(events) // 9
    for i in range(8):
        events.insert((i + 1) * step, dict(planted[i % len(planted)]))
    path = tmp_path / "planted.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setattr(decode, "CHUNK_BYTES", 256 << 10)
    return load_trace(path, workers=1), load_trace(path, workers=2, parallel_min_bytes=1)


def test_parallel_skipped_counts_add_up(tmp_path, monkeypatch, spy):
    """Bad events spread over every process's share: the same rows survive, and the skipped count
    is the number injected."""
    bad = [{"ph": "X", "cat": "kernel", "name": "neg", "pid": 0, "tid": 7, "ts": 10.0, "dur": -1.0},
           {"ph": "X", "cat": "cpu_op", "name": "no_ts", "pid": 1, "tid": 1, "dur": 2.0},
           {"ph": "X", "cat": "cpu_op", "name": "huge", "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0,
            "args": {"External id": 2**70}},
           {"ph": "X", "cat": "cpu_op", "name": 5, "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0}]
    ser, par = _planted_serial_and_parallel(bad, tmp_path, monkeypatch)
    assert len(spy) == 1
    assert par.meta["skipped_events"] == 8 == ser.meta["skipped_events"]
    assert par.meta["skipped_reasons"] == ser.meta["skipped_reasons"]
    assert not par.events["name"].isin(["neg", "no_ts", "huge"]).any()
    _assert_same(par, ser)


def test_failed_worker_falls_back_to_serial(tmp_path, monkeypatch, spy):
    monkeypatch.setattr(decode, "CHUNK_BYTES", 64 << 10)
    monkeypatch.setattr(P, "_SERVE", "import sys; sys.exit(3)")
    path = _plain_copy(trace_named("tracelens_h100_bert_small"), tmp_path)
    par = load_trace(path, workers=2, parallel_min_bytes=1)
    assert spy == []  # the parallel decode raised; the serial one gave the Trace
    _assert_same(par, load_trace(path, workers=1))


def test_worker_count_rules(tmp_path, monkeypatch):
    import mmap

    path = tmp_path / "t.json"
    path.write_bytes(b"{}" + b" " * 4096)
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    mapped = Payload(str(path), mm, mm, file_backed=True, path=str(path))
    monkeypatch.delenv(P.ENV_WORKERS, raising=False)
    assert P.worker_count(mapped, None, 1 << 20) == 1  # small: serial
    assert P.worker_count(Payload("b", b"x" * 8192), 4, 1) == 1  # bytes: serial
    assert P.worker_count(mapped, 3, 1) == 3
    monkeypatch.setenv(P.ENV_WORKERS, "1")
    assert P.worker_count(mapped, None, 1) == 1
    monkeypatch.setattr(P.os, "cpu_count", lambda: 1)
    monkeypatch.delenv(P.ENV_WORKERS)
    assert P.worker_count(mapped, None, 1) == 1
    mm.close()


@pytest.mark.parametrize("layout", ["objects_after", "array_format", "bom", "empty_events"])
def test_unusual_layouts_match_serial(layout, tmp_path, monkeypatch, spy):
    """Where the events array cannot be found cheaply (or a later array of objects looks like its
    end), the result is still the serial one (by a serial retry when needed)."""
    doc = json.loads(gzip.decompress(trace_named("tracelens_h100_bert_small").read_bytes()))
    if layout == "objects_after":
        text = json.dumps({"traceEvents": doc["traceEvents"], "extra": [{"a": 1}, {"b": [2]}]})
    elif layout == "array_format":
        text = json.dumps(doc["traceEvents"])
    elif layout == "bom":
        text = "\ufeff" + json.dumps(doc)
    else:
        text = json.dumps({"traceEvents": [], "deviceProperties": [{"id": 0}]})
    path = tmp_path / "t.json"
    path.write_bytes(text.encode())
    monkeypatch.setattr(decode, "CHUNK_BYTES", 64 << 10)

    def load(**kw):
        try:
            return load_trace(path, **kw)
        except Exception as exc:  # the same one-line error either way
            return f"{type(exc).__name__}: {exc}"

    ser, par = load(workers=1), load(workers=2, parallel_min_bytes=1)
    if isinstance(ser, str):
        assert par == ser
    else:
        _assert_same(par, ser)


def test_bind_flows_matches_plain_python_with_ties():
    """links.bind_flows (vectorised, used after a parallel merge) against a plain-Python reading of
    its rule, on keys with many ties: a flow takes the first row with its (pid, tid, ts), a row the
    first flow; output in flow order."""
    from profiler.trace import links

    rng = np.random.default_rng(7)
    n, m = 400, 300
    kind = rng.choice(np.array(links.FLOW_TARGETS + (0,), np.int8), n)
    pid, tid = rng.integers(0, 3, n), rng.integers(0, 3, n)
    ts = rng.integers(0, 6, n).astype(float) * rng.choice([1.0, -1.0], n)
    flows = {"pid": rng.integers(0, 3, m), "tid": rng.integers(0, 3, m),
             "ts": rng.integers(-6, 6, m).astype(float), "id": rng.integers(0, 10**6, m)}
    rows, ids, unbound = links.bind_flows(kind, pid, tid, ts, flows)
    want_rows, want_ids, taken = [], [], set()
    for f in range(m):
        key = (flows["pid"][f], flows["tid"][f], flows["ts"][f])
        match = [r for r in range(n) if kind[r] in links.FLOW_TARGETS and (pid[r], tid[r], ts[r]) == key]
        if match and match[0] not in taken:
            taken.add(match[0])
            want_rows.append(match[0])
            want_ids.append(flows["id"][f])
    assert rows.tolist() == want_rows and ids.tolist() == want_ids
    assert unbound == m - len(want_rows)


def test_hung_worker_is_killed_and_serial_decode_takes_over(tmp_path, monkeypatch, spy):
    monkeypatch.setattr(decode, "CHUNK_BYTES", 64 << 10)
    monkeypatch.setattr(P, "_SERVE", "import time; time.sleep(600)")
    monkeypatch.setattr(P, "WATCHDOG_MIN_S", 1.0)
    monkeypatch.setattr(P, "WATCHDOG_S_PER_BYTE", 0.0)
    path = _plain_copy(trace_named("tracelens_h100_bert_small"), tmp_path)
    import time

    t0 = time.perf_counter()
    par = load_trace(path, workers=2, parallel_min_bytes=1)
    assert time.perf_counter() - t0 < 60  # not the worker's 600 s
    assert spy == []
    _assert_same(par, load_trace(path, workers=1))


def test_parallel_unread_counts_add_up(tmp_path, monkeypatch, spy):
    """Events of kinds no column reads, spread over every process's share: counted once each."""
    odd = [{"ph": "X", "cat": "xpu_runtime", "name": "launch", "pid": 1, "tid": 1, "ts": 10.0, "dur": 1.0},
           {"ph": "B", "name": "b", "pid": 1, "tid": 1, "ts": 10.0}]
    ser, par = _planted_serial_and_parallel(odd, tmp_path, monkeypatch)
    assert len(spy) == 1
    assert dict(par.meta["unread_events"]) == {'"xpu_runtime"': 4, 'ph "B" events': 4} == dict(ser.meta["unread_events"])
    _assert_same(par, ser)
