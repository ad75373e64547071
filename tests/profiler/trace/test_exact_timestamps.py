"""Unix-epoch µs timestamps with ns fractions (1712195495519689.047) load to the nanosecond.

float64 steps by 0.25 µs at 1.7e15, so parsing such a `ts` as a float moves it by up to 0.125 µs
and makes distinct instants equal. The loader keeps those texts and subtracts the integer part
first (`_columns.exact_ts`). The files here are written as text, digit by digit: `json.dumps` of a
float would lose the very digits under test.
"""
from __future__ import annotations

import gzip
from decimal import Decimal
from pathlib import Path

import msgspec
import numpy as np
import pytest

from profiler.trace import load_trace
from profiler.trace._columns import exact_ts
from profiler.trace.decode import EXACT_FROM_US, ts_base

EPOCH = 1712195495519689  # µs since 1970: April 2024
PID, TID = 100, 200


def _x(cat: str, name: str, ts: str, dur: str, pid: int = PID, tid: int = TID, args: str = "{}") -> str:
    return (f'{{"ph": "X", "cat": "{cat}", "name": "{name}", "pid": {pid}, "tid": {tid}, '
            f'"ts": {ts}, "dur": {dur}, "args": {args}}}')


def _doc(events: list[str]) -> str:
    return '{"schemaVersion": 1, "traceEvents": [\n' + ",\n".join(events) + "\n]}"


def _write(tmp_path: Path, name: str, events: list[str]) -> Path:
    path = tmp_path / name
    path.write_text(_doc(events))
    return path


def test_exact_ts_parses_every_json_number_form():
    texts = [b"1712195495519689.047", b"1712195495519695.812", b"1712195495519689", b"-12.5", b"-0.25",
             b"1712195495519689.1234567891234", b"1.7e15", b'"1712195495519689.047"', b"null", b"",
             b"12345678901234567890"]
    got = exact_ts([msgspec.Raw(t) for t in texts], EPOCH)
    want = [0.047, 6.812, 0.0, -12.5 - EPOCH, -0.25 - EPOCH, 0.123456789, 1.7e15 - EPOCH, np.nan, np.nan,
            np.nan, 12345678901234567890.0 - EPOCH]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], np.array(want)[ok], rtol=1e-15, atol=1e-12)
    assert exact_ts([], EPOCH).shape == (0,)


def test_a_huge_ts_text_is_read_alone_not_as_the_width_of_every_row():
    """20,000 rows beside one 4 MB string: a fixed-width array of them would take 80 GB."""
    texts = [msgspec.Raw(f"{EPOCH}.{i % 1000:03d}".encode()) for i in range(20_000)]
    texts[5] = msgspec.Raw(b'"' + b"x" * (4 << 20) + b'"')
    got = exact_ts(texts, EPOCH)
    assert np.isnan(got[5]) and np.isnan(got).sum() == 1
    assert got[6] == pytest.approx(0.006, abs=1e-12)


def test_only_fractional_timestamps_beyond_float64s_nanosecond_switch_it_on():
    assert ts_base(memoryview(b'[{"ts": 1712195495519689.047, "dur": 1}]')) == EPOCH
    assert ts_base(memoryview(b'[{"ts":1712195495519689.5}]')) == EPOCH
    assert ts_base(memoryview(b'[{"ts": 1712195495519689, "dur": 1.5}]')) is None  # whole µs: float64 is exact
    assert ts_base(memoryview(b'[{"ts": 1419247332972.313}]')) is None  # 16 days: float64 holds the ns
    below, at = EXACT_FROM_US - 1, EXACT_FROM_US
    assert ts_base(memoryview(f'[{{"ts": {below}.5}}]'.encode())) is None
    assert ts_base(memoryview(f'[{{"ts": {at}.5}}]'.encode())) == at
    # beyond int64 ns (found by the fuzzer: 9225085646806957267.240 overflowed int64): passed over
    assert ts_base(memoryview(b'[{"ts": 9225085646806957267.240}, {"ts": 1712195495519689.5}]')) == EPOCH


def test_ns_fractions_survive_and_distinct_instants_stay_distinct(tmp_path):
    # Four launches 53, 100, 147 and 1,312 ns apart: float64 at 1.7e15 makes the first three equal.
    fracs = ["047", "100", "147", "312"]
    events = [_x("cuda_runtime", "cudaLaunchKernel", f"{EPOCH + (i // 3)}.{f}", "3.250") for i, f in enumerate(fracs)]
    events.append(_x("kernel", "k", f"{EPOCH + 5}.001", "1.999", pid=0, tid=7, args='{"device": 0, "stream": 7}'))
    tr = load_trace(_write(tmp_path, "epoch.json", events))
    ev = tr.events
    want = [float(Decimal(f"{EPOCH + (i // 3)}.{f}") - Decimal(f"{EPOCH}.047")) for i, f in enumerate(fracs)]
    np.testing.assert_allclose(ev["ts_us"].to_numpy()[:4], want, rtol=0, atol=1e-9)
    assert ev["ts_us"].nunique() == 5
    assert abs(ev["ts_us"].iloc[4] - 4.954) < 1e-9  # 5.001 - 0.047
    assert tr.meta["t0_us"] == float(Decimal(f"{EPOCH}.047"))


def test_flows_bind_to_the_launch_at_their_nanosecond(tmp_path):
    """Two launches 53 ns apart on one thread: each flow finds its own (float64 merged the two)."""
    a, b = f"{EPOCH}.047", f"{EPOCH}.100"
    events = [_x("cuda_runtime", "cudaLaunchKernel", a, "2.0", args='{"correlation": 1}'),
              _x("cuda_runtime", "cudaLaunchKernel", b, "2.0", args='{"correlation": 2}'),
              f'{{"ph": "s", "id": 2, "pid": {PID}, "tid": {TID}, "ts": {b}, "cat": "ac2g", "name": "ac2g"}}',
              f'{{"ph": "s", "id": 1, "pid": {PID}, "tid": {TID}, "ts": {a}, "cat": "ac2g", "name": "ac2g"}}']
    tr = load_trace(_write(tmp_path, "flows.json", events))
    ev = tr.events
    assert ev["correlation"].tolist() == [1, 2]
    assert ev["flow_id"].tolist() == [1, 2]
    assert tr.meta["unbound_flows"] == 0


def test_memory_samples_and_counters_share_the_rows_clock(tmp_path):
    events = [_x("cpu_op", "aten::empty", f"{EPOCH}.517", "1.0"),
              f'{{"ph": "i", "s": "t", "name": "[memory]", "pid": {PID}, "tid": {TID}, "ts": {EPOCH}.803, '
              '"args": {"Device Type": 1, "Device Id": 0, "Bytes": 4096, "Total Allocated": 4096, '
              '"Total Reserved": 8192, "Addr": 1}}',
              f'{{"ph": "C", "name": "gpu_util", "pid": 0, "ts": {EPOCH + 2}, "args": {{"value": 42.5}}}}']
    tr = load_trace(_write(tmp_path, "side.json", events))
    assert tr.events["ts_us"].tolist() == [0.0]
    assert tr.memory["ts_us"].tolist() == pytest.approx([0.286], abs=1e-9)
    assert tr.counters["ts_us"].tolist() == pytest.approx([1.483], abs=1e-9)  # whole µs: exact as float64


def test_a_bad_timestamp_is_skipped_and_counted_the_others_kept(tmp_path):
    events = [_x("cpu_op", "good", f"{EPOCH}.047", "1.0"), _x("cpu_op", "text", '"soon"', "1.0"),
              _x("cpu_op", "none", "null", "1.0"), _x("cpu_op", "good2", f"{EPOCH}.048", "1.0")]
    tr = load_trace(_write(tmp_path, "bad.json", events))
    assert tr.events["name"].astype(str).tolist() == ["good", "good2"]
    assert tr.events["ts_us"].tolist() == pytest.approx([0.0, 0.001], abs=1e-9)
    assert tr.meta["skipped_events"] == 2


def test_an_epoch_rank_and_an_integer_rank_align_on_one_clock(tmp_path):
    """A whole-µs file (float64 decoded) beside an exact one: both on the exact file's clock."""
    exact = _write(tmp_path, "r0.json", [_x("cpu_op", "a", f"{EPOCH}.047", "1.0"),
                                         _x("cpu_op", "b", f"{EPOCH}.100", "1.0")])
    whole = _write(tmp_path, "r1.json", [_x("cpu_op", "c", f"{EPOCH + 3}", "1.0")])
    tr = load_trace([exact, whole], rank=[0, 1])
    got = dict(zip(tr.events["name"].astype(str), tr.events["ts_us"]))
    assert got == pytest.approx({"a": 0.0, "b": 0.053, "c": 2.953}, abs=1e-9)


def test_gzip_and_several_processes_decode_the_same(tmp_path):
    """Serial, gzipped and 2-process decodes of one ~12 MB epoch trace give the same frame."""
    rng = np.random.default_rng(7)
    gaps = rng.integers(1, 5000, 60_000).cumsum()  # ns
    events = [_x("cpu_op", f"op{i % 17}", f"{EPOCH + int(g) // 1000}.{int(g) % 1000:03d}", "0.512",
                 args=f'{{"External id": {i}, "Input Dims": [[{i % 7}, 3]], "Input type": ["float"]}}')
              for i, g in enumerate(gaps)]
    plain = _write(tmp_path, "big.json", events)
    zipped = tmp_path / "big.json.gz"
    zipped.write_bytes(gzip.compress(plain.read_bytes(), compresslevel=1))
    serial = load_trace(plain, workers=1)
    two = load_trace(plain, workers=2, parallel_min_bytes=1)
    gz = load_trace(zipped)
    want = (gaps - gaps[0]) / 1000.0
    np.testing.assert_allclose(serial.events["ts_us"].to_numpy(), want, rtol=0, atol=1e-9)
    for other in (two, gz):
        assert serial.events.equals(other.events)
        assert serial.meta["t0_us"] == other.meta["t0_us"]
