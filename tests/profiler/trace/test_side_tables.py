"""Side tables and meta: `ph: C` counters, `[memory]` events, metadata names, required meta keys."""
from __future__ import annotations

import json

import pandas as pd

from profiler.trace import load_trace
from profiler.trace.schema import COUNTER_COLUMNS, MEMORY_COLUMNS, SCHEMA_VERSION


def _trace(tmp_path, events, **top):
    path = tmp_path / "side.json"
    path.write_text(json.dumps({"traceEvents": events, **top}))
    return load_trace(path)


def test_counters_memory_and_names(tmp_path):
    events = [
        {"ph": "M", "name": "process_name", "pid": 9, "tid": 0, "args": {"name": "python3"}},
        {"ph": "M", "name": "thread_name", "pid": 9, "tid": 12, "args": {"name": "worker"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 9, "tid": 12, "ts": 100.0, "dur": 4.0},
        {"ph": "C", "name": "gpu_util", "pid": 0, "ts": 101.0, "args": {"gpu_util": 87.5}},
        {"ph": "C", "name": "mem", "pid": 1, "ts": 102.0, "args": {"used": 3, "free": 5, "label": "x"}},
        {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 9, "tid": 12, "ts": 99.0,
         "args": {"Total Reserved": 2048, "Total Allocated": 1024, "Bytes": 512, "Addr": 77,
                  "Device Id": 0, "Device Type": 1}},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 9, "tid": 12, "ts": 103.0,
         "args": {"Device Type": 0, "Device Id": -1, "Bytes": -512}},
        {"ph": "i", "s": "t", "name": "something else", "pid": 9, "tid": 12, "ts": 104.0},
    ]
    tr = _trace(tmp_path, events, schemaVersion=1, deviceProperties=[{"id": 0, "name": "GPU X"}],
                cuda_runtime_version=12040, distributedInfo={"backend": "nccl", "rank": 3, "world_size": 4})
    assert tr.meta["t0_us"] == 100.0  # the earliest event row; memory samples may come before it
    c = tr.counters.sort_values(["ts_us", "name"]).reset_index(drop=True)
    assert list(c.columns) == list(COUNTER_COLUMNS)
    assert c[["ts_us", "value"]].values.tolist() == [[1.0, 87.5], [2.0, 5.0], [2.0, 3.0]]
    assert list(c["name"].astype(str)) == ["gpu_util", "mem.free", "mem.used"]
    assert list(c["device"]) == [0, 1, 1] and set(c["rank"]) == {3}
    m = tr.memory.sort_values("ts_us").reset_index(drop=True)
    assert list(m.columns) == list(MEMORY_COLUMNS)
    assert m["ts_us"].tolist() == [-1.0, 3.0] and m["bytes"].tolist() == [512, -512]
    assert m["total_allocated"].tolist()[0] == 1024 and pd.isna(m["total_allocated"].tolist()[1])
    meta = tr.meta
    assert meta["per_rank"][3]["process_names"] == {"9": "python3"}
    assert meta["per_rank"][3]["thread_names"] == {"9:12": "worker"}
    for key in ("schema_version", "sources", "t0_us", "ranks", "skipped_events", "skipped_reasons",
                "device_properties", "per_rank", "distributed_info", "versions"):
        assert key in meta
    assert meta["schema_version"] == SCHEMA_VERSION and meta["ranks"] == (3,)
    assert meta["versions"]["cuda_runtime_version"] == 12040
    assert meta["device_properties"][0]["name"] == "GPU X"


def test_trace_is_frozen_and_has_no_events_table_aliasing(tmp_path):
    tr = _trace(tmp_path, [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 5, "dur": 1}])
    try:
        tr.meta["t0_us"] = 1.0
    except TypeError:
        pass
    else:
        raise AssertionError("meta must be read-only")
    assert tr.events["step"].isna().all() and tr.events["flow_id"].isna().all()
