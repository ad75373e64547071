"""Shared helpers for the trace tests: the real traces and an independent reading of their JSON.

`raw_truth` recomputes the facts the Trace must agree with from the raw JSON using only json and
gzip (no project code), with its own category table.
"""
from __future__ import annotations

import functools
import gzip
import json
import math
import re
from decimal import Decimal
from pathlib import Path

import pytest

TRACES_DIR = Path(__file__).resolve().parents[2] / "data" / "traces"
TRACE_FILES = sorted(TRACES_DIR.glob("*.json.gz"))

# The test's own table of kept categories (current + 2021 spelling) -> kind.
CATEGORY_KIND = {
    "cpu_op": "cpu_op", "Operator": "cpu_op", "user_annotation": "user_annotation",
    "python_function": "python_function", "cuda_runtime": "cuda_runtime", "Runtime": "cuda_runtime",
    "cuda_driver": "cuda_driver", "Driver": "cuda_driver", "kernel": "kernel", "Kernel": "kernel",
    "gpu_memcpy": "gpu_memcpy", "Memcpy": "gpu_memcpy", "gpu_memset": "gpu_memset", "Memset": "gpu_memset",
    "gpu_user_annotation": "gpu_user_annotation", "cuda_sync": "cuda_sync",
}
GPU_ROW_KINDS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
HALF_NS_US = 5e-4  # "to the nanosecond": within half a nanosecond of the exact decimal value


def read_json(path: Path, exact: bool = False) -> dict:
    """The file's JSON; `exact` parses fractional numbers as Decimal (timestamps near 1.7e15 µs
    lose up to 0.125 µs as float64)."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data, parse_float=Decimal) if exact else json.loads(data)


def _int_id(value):
    if isinstance(value, int):
        return value
    m = re.search(r"-?\d+", str(value))
    return int(m.group()) if m else None


@functools.lru_cache(maxsize=None)
def raw_truth(path: Path) -> dict:
    """Facts recomputed from the raw JSON in plain Python."""
    doc = read_json(path)
    kept = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in CATEGORY_KIND]
    kernels = [e for e in kept if CATEGORY_KIND[e["cat"]] == "kernel"]
    rank = (doc.get("distributedInfo") or {}).get("rank", 0)
    streams = set()
    for e in kept:
        if CATEGORY_KIND[e["cat"]] in GPU_ROW_KINDS:
            args = e.get("args") or {}
            dev = args["device"] if isinstance(args.get("device"), int) else _int_id(e["pid"])
            stream = args["stream"] if isinstance(args.get("stream"), int) else _int_id(e["tid"])
            streams.add((rank, dev, stream))
    exact = [e for e in read_json(path, exact=True)["traceEvents"]
             if e.get("ph") == "X" and e.get("cat") in CATEGORY_KIND]
    t0 = min(e["ts"] for e in exact)  # Decimal (or int): the exact first timestamp
    by_kind: dict[str, int] = {}
    for e in kept:
        by_kind[CATEGORY_KIND[e["cat"]]] = by_kind.get(CATEGORY_KIND[e["cat"]], 0) + 1
    return {
        "doc": doc, "kept": kept, "rank": rank, "kernel_count": len(kernels),
        "kernel_total_us": math.fsum(e["dur"] for e in kernels), "streams": streams,
        "first_ts": float(t0), "last_end_rel": float(max((e["ts"] - t0) + e["dur"] for e in exact)),
        "ts_exact": tuple(sorted(e["ts"] for e in exact)),  # Decimal/int, as written
        "by_kind": by_kind, "kernel_names": sorted(e["name"] for e in kernels),
    }


@functools.lru_cache(maxsize=None)
def loaded(path: Path):
    from profiler.trace import load_trace

    return load_trace(path)


@pytest.fixture(params=TRACE_FILES, ids=[p.name.split(".")[0] for p in TRACE_FILES])
def trace_path(request) -> Path:
    return request.param


def trace_named(prefix: str) -> Path:
    (path,) = [p for p in TRACE_FILES if p.name.startswith(prefix)]
    return path
